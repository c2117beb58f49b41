#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/strings.json: the test strings every tokenizer is checked on.

Deterministic (fixed seed), so the file can be regenerated and diffed. Hand-written cases cover
the hard spots of byte-level BPE (scripts, emoji ZWJ sequences, combining marks, full-width forms,
control characters, whitespace runs, code, numbers, contractions, special tokens inside text);
seeded random mixtures of those pieces add volume.
"""
import json
import random
import sys
from pathlib import Path

HAND_WRITTEN = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    "a",
    "Hello world",
    "Hello, world!",
    " Hello world",
    "hello  world",
    "Hello\nworld",
    "Hello\r\nworld\r\n",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.",
    # contractions, both cases, and look-alikes
    "I'm you're he's she'll we've they'd it's don't can't won't",
    "I'M YOU'RE HE'S SHE'LL WE'VE THEY'D IT'S DON'T CAN'T WON'T",
    "I'm You'Re HE's sHe'lL",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "rock'n'roll o'clock y'all ma'am",
    "it’s curly ‘quotes’ and “double”",
    "'ſ 'K 'ﬅ",
    "''' \"\"\" ``` '''s",
    # numbers
    "0",
    "12",
    "123",
    "1234",
    "12345678901234567890",
    "3.14159 2.71828 -42 +7 1e-9 0x1F 0b1010",
    "1,000,000 and 1.000.000 and 1 000 000",
    "Version 2.10.3-rc1 (build 20240115)",
    "٠١٢٣٤٥٦٧٨٩ ۱۲۳ १२३ ১২৩ ๑๒๓",
    "①②③ ⅠⅡⅢ ½ ¾ ² ³ ¹",
    "１２３４５ ＡＢＣ ａｂｃ",
    "phone: +1 (555) 123-4567, date: 2024-01-15T10:30:00Z",
    # Chinese
    "你好，世界！",
    "我爱北京天安门。",
    "人工智能正在改变世界，大型语言模型可以理解和生成自然语言。",
    "请问如何使用GPU加速推理？谢谢！",
    "这是一个测试：中文、English、数字123混合。",
    "《红楼梦》是中国古典四大名著之一。",
    "龘靐齉爩 𠀀𠀁𪚥 鿿",
    "「引用」『二重』【括弧】〔亀甲〕",
    # Japanese
    "こんにちは世界",
    "日本語のテキストをトークン化します。",
    "カタカナとひらがなと漢字が混ざっている文章です。",
    "ｶﾀｶﾅ ﾊﾝｶｸ ｰ ﾞﾟ",
    "東京都渋谷区１−２−３",
    "ゔ ゕ ゖ ゟ ヿ ㇰ",
    # Korean
    "안녕하세요 세계",
    "한국어 텍스트를 토큰화합니다.",
    "ㄱㄴㄷ ㅏㅑㅓ 한글",
    "\u1100\u1161\u11a8 decomposed jamo",
    # Arabic, Hebrew, other scripts
    "مرحبا بالعالم",
    "اللغة العربية جميلة جداً.",
    "السَّلَامُ عَلَيْكُمْ",
    "שלום עולם",
    "Привет, мир! Как дела?",
    "Ελληνικά: Γειά σου Κόσμε",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Xin chào thế giới",
    "გამარჯობა მსოფლიო",
    "Բարեւ աշխարհ",
    "ሰላም ልዑል",
    "mixed: English 中文 日本語 한국어 العربية русский",
    # emoji
    "😀",
    "😀😃😄😁",
    "I love 🍕 and 🍣!",
    "👨‍👩‍👧‍👦",
    "👩🏽‍💻 👨🏿‍🚀 🧑🏻‍🤝‍🧑🏾",
    "🏳️‍🌈 🏴‍☠️",
    "🇺🇸🇯🇵🇨🇳🇩🇪",
    "❤️ ♥ ☺️ ✌🏽",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    "1️⃣ #️⃣ *️⃣",
    "emoji at end 🎉",
    "🎉emoji at start",
    "a😀b😀c",
    # combining marks and normalization
    "e\u0301",
    "cafe\u0301 vs café",
    "A\u030a vs Å vs \u212b",
    "n\u0303o\u0308u\u0308",
    "Z\u0351\u0353\u0362a\u0358\u0345l\u0336g\u0315o\u0334",
    "\u1e9b\u0323",
    "\uac00 vs \u1100\u1161",
    "ﬁ ﬂ ﬀ ﬃ",
    "\u2126 \u00c5 \u212a",
    "x\u0300\u0301\u0302\u0303\u0304\u0305\u0306\u0307\u0308",
    # full-width forms
    "ＨＥＬＬＯ　ＷＯＲＬＤ！",
    "全角スペース　と　記号！？",
    "（括弧）［角］｛波｝",
    "ｈｔｔｐｓ：／／ｅｘａｍｐｌｅ．ｃｏｍ",
    # control characters and odd whitespace
    "\x00",
    "a\x00b",
    "\x01\x02\x03\x04\x05\x06\x07\x08",
    "\x0b\x0c\x0e\x0f\x10\x1b[31mred\x1b[0m",
    "\x1c\x1d\x1e\x1f",
    "\x7f\x80\x85\x9f",
    "line\u2028sep\u2029para",
    "nbsp\u00a0here\u00a0\u00a0twice",
    "zero\u200bwidth\u200cjoiner\u200dnon\u2060word",
    "\ufeffBOM at start",
    "en\u2002em\u2003thin\u2009hair\u200a",
    "ideographic\u3000space",
    "mongolian\u180evowel",
    "narrow\u202fnbsp\u205fmath",
    "soft\u00adhyphen",
    "\u200e\u200f\u202a\u202b\u202c\u202d\u202e",
    "\ufffd replacement",
    "private \ue000\uf8ff \U000f0000",
    "noncharacters \ufdd0 \ufffe",
    # whitespace runs
    " " * 2 + "x",
    " " * 16,
    " " * 100,
    "\t" * 8,
    "\n" * 10,
    " \n \n \n",
    "a" + " " * 10 + "b",
    "a" + " " * 10 + "\n" + " " * 10 + "b",
    "\t\t  \n\n  \t",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\nleading newlines",
    "trailing newlines\n\n\n",
    "   \r\n   \r\n",
    "a \n b \r\n c",
    # long repeats
    "a" * 200,
    "ab" * 100,
    "-" * 80,
    "=" * 64,
    "😀" * 50,
    "中" * 100,
    "0" * 100,
    ".........." * 5,
    # code
    "def foo(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
    "const f = async (a, b) => { await g(a?.b ?? c); };",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
    "if __name__ == '__main__':\n    main()",
    "git commit -m 'fix: handle CRLF'; echo $? && ls -la | grep '\\.cpp$'",
    "    indented with spaces\n\tindented with tab\n        deeper",
    "regex: ^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$",
    "std::vector<std::pair<int, std::string>> v{{1, \"a\"}};",
    "// comment\n/* block */\n# hash\n-- dash",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f**=6;g//=7;h>>=8;i<<=9",
    "```python\nprint('hello')\n```",
    "$ ./configure --prefix=/usr/local && make -j8",
    "https://example.com/path?query=1&other=two#frag",
    "user@example.com, admin+tag@sub.domain.org",
    "C:\\Users\\name\\Documents\\file.txt",
    "/usr/local/bin/python3.11",
    "  File \"main.py\", line 3, in <module>\nValueError: bad",
    # math and symbols
    "∀x∈ℝ: x² ≥ 0 ⇒ √(x²) = |x|",
    "∑_{i=1}^{n} i = n(n+1)/2",
    "α β γ δ ε ζ η θ",
    "€100 £50 ¥1000 ₹500 ₿1 $5 ¢",
    "©®™ §¶ †‡ •◦ …",
    "←↑→↓ ⇐⇑⇒⇓ ↔",
    "★☆♠♣♥♦ ♪♫",
    "…—–‒―",
    "«guillemets» „low-high“ ‹single›",
    "!!!???...,,,;;;:::",
    "!@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "a!b@c#d$e%f^g&h*i(j)k",
    # misc prose
    "Mr. Smith's car isn't here; it's at Dr. Jones' garage.",
    "The U.S.A. and the U.K. signed the agreement on Jan. 1st, 2024.",
    "She said, \"I can't believe it!\" and left.",
    "e.g. i.e. etc. vs. a.m. p.m.",
    "Ünïcödé Çàfé Naïve Résumé Façade Jalapeño",
    "Straße Maß Größe ß ẞ",
    "İstanbul ılık ığdır",
    "ǅ ǈ ǋ Ǆ ǆ",
    "ﬆ ſt",
]

# Special tokens of every tokenizer under test; each is plain text for the others.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|vision_pad|>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|python_tag|>", "<|reserved_special_token_5|>",
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁sep｜>",
    "<｜tool▁calls▁begin｜>",
]

SPECIAL_CASES = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜>Hi<｜end▁of▁sentence｜>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>",
    "text<|endoftext|>text",
    " <|endoftext|> ",
    "<|endoftext|><|endoftext|>",
    "<|im_end|",
    "<|im_start",
    "<|endoftext|>>",
    "<<|endoftext|>",
    "<|IM_START|>",
    "< |im_start| >",
    "<|reserved_special_token_999|>",
    "<|begin_of_text|>",
    "<｜end▁of▁sentence｜>",
    "  <think>  ",
    "\n<think>\n",
    "x</think>y",
]


PIECES = [
    "hello", "World", " the", " THE", "don't", "DON'T", "I'll", "you've", "123", "4567", "3.14", "你好", "世界",
    "日本語", "カタカナ", "한국어", "مرحبا", "Привет", "😀", "👨‍👩‍👧", "🇯🇵", "e\u0301", "ＡＢＣ", "\t", "\n",
    "\r\n", "  ", "   ", "\u3000", "\u00a0", "()", "{}", "=>", "::", "...", "!!", "?", ",", ";", "'s", "'S",
    "_id", "fooBar", "snake_case", "x86_64", "\x00", "\x7f", "\u200d", "<", ">", "|", "<|", "|>",
]


def random_mixtures(rng, count):
    out = []
    for _ in range(count):
        n = rng.randint(2, 12)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.08:
                parts.append(rng.choice(SPECIAL_TOKENS))
            elif r < 0.75:
                parts.append(rng.choice(PIECES))
            else:
                parts.append(rng.choice([" ", "  ", "\n", ""]))
        out.append("".join(parts))
    return out


def random_codepoints(rng, count):
    """Random code points from many blocks (no surrogates: HF inputs are valid Unicode)."""
    ranges = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
              (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x22ff),
              (0x3000, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xff00, 0xffef), (0x1f300, 0x1faff),
              (0x20000, 0x2a6df), (0x0, 0x1f)]
    out = []
    for _ in range(count):
        n = rng.randint(1, 24)
        chars = []
        for _ in range(n):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        out.append("".join(chars))
    return out


def main():
    root = Path(__file__).resolve().parent.parent
    target = root / "tests/fixtures/tokenizer/strings.json"
    rng = random.Random(20240611)
    strings = HAND_WRITTEN + SPECIAL_TOKENS + SPECIAL_CASES
    strings += [f"before {t} after" for t in SPECIAL_TOKENS]
    strings += random_mixtures(rng, 90)
    strings += random_codepoints(rng, 60)
    seen, unique = set(), []
    for s in strings:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    doc = {
        "note": "Test strings for the tokenizer; written by tools/make_tokenizer_strings.py. "
                "Reference ids come from tools/make_tokenizer_refs.py.",
        "strings": unique,
    }
    target.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(unique)} strings to {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
