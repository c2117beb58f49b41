#!/usr/bin/env python3
"""Builds the training corpus of the demo model (issue 21) from Debian packages.

Plain Python 3 (no third-party modules). Needs the packages installed:

    apt-get install -y fortunes-zh fortunes
    python3 tools/demo_data.py            # writes tools/demo_data/{train,heldout}.jsonl, SOURCES.md

Sources (licences from /usr/share/doc/<pkg>/copyright, recorded in SOURCES.md):
  - fortunes-zh (GPL-3.0+): tang300 (Tang poems), song100 (Song poems), chinese (proverbs, classics,
    more poems);
  - fortunes and fortunes-min (BSD-3-Clause, from fortune-mod): English fortunes and quotes.
  The offensive set (fortunes-off) is not used.

Each output line is one JSON object: {"id", "source", "kind": "chat", "messages": [...]} or
{"id", "source", "kind": "text", "text": ...}. Examples made:
  - 五言绝句 / 七言绝句 requests: "写一首关于{主题}的五言绝句" -> a four-line poem, one clause of five
    (seven) CJK characters plus its punctuation per line. Real quatrains, and the four-line halves of
    longer regular poems (律诗 and longer), so that the form is seen often; the theme is a character
    that occurs in the poem;
  - recitation of a poem by title and author, and "who wrote 《title》";
  - "Tell me a quote about {word}." -> an English fortune containing the word;
  - plain text (every poem, Chinese entry and English fortune) for language modelling.
The held-out set (~2%) is chosen per source item (a poem, a fortune) by a hash of its text, so no
prompt built from a held-out item is in the training set. Deterministic: same packages, same output.
"""
import argparse
import hashlib
import json
import os
import random
import re
import sys

FORTUNE_DIR = "/usr/share/games/fortunes"
ZH_FILES = ["tang300", "song100", "chinese"]
PACKAGES = {
    "fortunes-zh": "GPL-3.0+ (Copyright 2001-2009 Yu Guanghui, 2015-2019 Mo Zhou, 2020-2021 xiao sheng wen)",
    "fortunes": "BSD-3-Clause (fortune-mod; Copyright (c) 1991 The Regents of the University of California)",
    "fortunes-min": "BSD-3-Clause (fortune-mod; Copyright (c) 1991 The Regents of the University of California)",
}
ZH_THEMES = ["月", "山", "春", "风", "花", "雪", "水", "秋", "云", "雨", "江", "夜", "酒", "柳", "日",
             "天", "人", "归", "家", "君", "马", "鸟", "草", "树", "石", "松", "竹", "梅", "舟", "门",
             "城", "兵", "边", "泪", "梦", "客", "老", "愁", "故乡", "明月", "春风", "白云", "长安"]
ZH_PROMPTS = ["写一首关于{t}的{form}", "请写一首关于{t}的{form}。", "以{t}为题，写一首{form}。",
              "作一首{form}，写{t}。"]
ZH_PROMPTS_PLAIN = ["写一首{form}", "请写一首{form}。"]
EN_THEMES = ["love", "life", "time", "work", "money", "computer", "friend", "truth", "war", "god", "art",
             "science", "music", "death", "happiness", "wisdom", "man", "woman", "world", "people",
             "power", "mind", "heart", "fool", "day", "night", "book", "law", "child", "marriage",
             "program", "mathematics", "politics", "history", "nature", "beauty", "success", "fear",
             "hope", "dream", "freedom", "peace", "knowledge", "learning", "food", "cat", "dog"]
EN_PROMPTS = ["Tell me a quote about {w}.", "Give me a quote about {w}.", "Do you know a saying about {w}?",
              "Share a quotation about {w}."]
HELDOUT_PERMILLE = 20
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CJK = re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf]")
CLAUSE = re.compile(r"([^，。？！；：、,.?!;:]+)([，。？！；：、,.?!;:])")


def read_entries(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = ANSI.sub("", f.read())
    out = []
    for e in re.split(r"\n%\n?", text):
        e = e.strip("\n")
        if e.strip():
            out.append(e)
    return out


def is_heldout(text):
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % 1000 < HELDOUT_PERMILLE


def parse_poem(entry):
    """Returns (title, author, body_lines) for the poem entries of tang300/song100/chinese, or None."""
    lines = [l.strip() for l in entry.split("\n") if l.strip()]
    if len(lines) < 3:
        return None
    m = re.match(r"^(?:题目[:：])?\s*《(.+?)》(.*)$", lines[0])
    a = re.match(r"^作者[:：]\s*([^（(\s]+)", lines[1])
    if not m or not a:
        return None
    body = [l for l in lines[2:] if not re.fullmatch(r"其[一二三四五六七八九十]+", l)]
    return m.group(1) + m.group(2).strip(), a.group(1), body


def clauses(body_lines):
    """Splits a poem body into (clause, punctuation) pairs; None if anything but clauses remains."""
    text = "".join(body_lines)
    pairs = CLAUSE.findall(text)
    if "".join(c + p for c, p in pairs) != text:
        return None
    return pairs


def regular_quatrains(pairs):
    """Four-clause groups of a regular poem (all clauses 5 or 7 CJK characters): (n, [4 lines])."""
    if not pairs or len(pairs) % 4 != 0:
        return []
    n = len(pairs[0][0])
    if n not in (5, 7) or any(len(c) != n or len(CJK.findall(c)) != n for c, _ in pairs):
        return []
    out = []
    for i in range(0, len(pairs), 4):
        group = pairs[i:i + 4]
        lines = [c + p for c, p in group]
        # the quatrain must end a sentence (the 4th clause ends with 。？！)
        if group[3][1] not in "。？！":
            continue
        out.append((n, lines, len(pairs) == 4))
    return out


def chat(user, assistant):
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def build(rng):
    items = []  # (source_text, [examples]) grouped per source item for the held-out split
    n_quatrains = {5: 0, 7: 0}
    for fn in ZH_FILES:
        path = os.path.join(FORTUNE_DIR, fn)
        for entry in read_entries(path):
            ex = []
            poem = parse_poem(entry)
            if poem:
                title, author, body = poem
                plain = "《{}》\n作者：{}\n{}".format(title, author, "\n".join(body))
                ex.append({"source": "fortunes-zh/" + fn, "kind": "text", "text": plain})
                ex.append({"source": "fortunes-zh/" + fn, "kind": "chat",
                           "messages": chat(rng.choice(["背诵{a}的《{t}》。", "请写出{a}的《{t}》。"]).format(
                               a=author, t=title), "\n".join(body))})
                ex.append({"source": "fortunes-zh/" + fn, "kind": "chat",
                           "messages": chat("《{}》的作者是谁？".format(title), "《{}》的作者是{}。".format(title, author))})
                for n, lines, whole in regular_quatrains(clauses(body) or []):
                    form = "五言绝句" if n == 5 else "七言绝句"
                    n_quatrains[n] += 1
                    poem_text = "".join(lines)
                    themes = [t for t in ZH_THEMES if t in poem_text]
                    rng.shuffle(themes)
                    answer = "\n".join(lines)
                    for t in themes[:6]:
                        ex.append({"source": "fortunes-zh/" + fn, "kind": "chat",
                                   "messages": chat(rng.choice(ZH_PROMPTS).format(t=t, form=form), answer)})
                    ex.append({"source": "fortunes-zh/" + fn, "kind": "chat",
                               "messages": chat(rng.choice(ZH_PROMPTS_PLAIN).format(form=form), answer)})
            else:
                ex.append({"source": "fortunes-zh/" + fn, "kind": "text", "text": entry.strip()})
            items.append((entry, ex))
    en_files = sorted(f for f in os.listdir(FORTUNE_DIR)
                      if os.path.isfile(os.path.join(FORTUNE_DIR, f)) and "." not in f and f not in ZH_FILES
                      and not os.path.islink(os.path.join(FORTUNE_DIR, f)))
    n_quotes = 0
    for fn in en_files:
        for entry in read_entries(os.path.join(FORTUNE_DIR, fn)):
            if CJK.search(entry):
                continue
            text = entry.strip()
            ex = [{"source": "fortunes/" + fn, "kind": "text", "text": text}]
            if len(text) <= 400:
                words = [w for w in EN_THEMES if re.search(r"\b" + w + r"s?\b", text, re.I)]
                if words:
                    w = rng.choice(words)
                    ex.append({"source": "fortunes/" + fn, "kind": "chat",
                               "messages": chat(rng.choice(EN_PROMPTS).format(w=w), text)})
                    n_quotes += 1
            items.append((entry, ex))
    return items, en_files, n_quatrains, n_quotes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_data"))
    ap.add_argument("--seed", type=int, default=21)
    args = ap.parse_args()
    missing = [f for f in ZH_FILES + ["fortunes"] if not os.path.isfile(os.path.join(FORTUNE_DIR, f))]
    if missing:
        sys.exit("demo_data.py: missing {} in {}: run `apt-get install -y fortunes-zh fortunes` first".format(
            ", ".join(missing), FORTUNE_DIR))
    rng = random.Random(args.seed)
    items, en_files, n_quatrains, n_quotes = build(rng)
    train, held = [], []
    for src, ex in items:
        (held if is_heldout(src) else train).extend(ex)
    rng.shuffle(train)
    os.makedirs(args.out, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", held)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            for i, r in enumerate(rows):
                f.write(json.dumps(dict(id="{}-{}".format(name.split(".")[0], i), **r), ensure_ascii=False) + "\n")
    stats = {"train_examples": len(train), "heldout_examples": len(held),
             "train_chat": sum(r["kind"] == "chat" for r in train),
             "quatrains_5": n_quatrains[5], "quatrains_7": n_quatrains[7], "en_quote_prompts": n_quotes,
             "english_files": en_files}
    with open(os.path.join(args.out, "SOURCES.md"), "w", encoding="utf-8") as f:
        f.write("# Demo model corpus: sources and licences\n\nGenerated by `tools/demo_data.py` (seed {}) from the "
                "files of these Debian packages under {}:\n\n".format(args.seed, FORTUNE_DIR))
        for p, lic in PACKAGES.items():
            f.write("- `{}`: {} (see /usr/share/doc/{}/copyright)\n".format(p, lic, p))
        f.write("\nChinese files: {}. English files: {}.\n\n".format(", ".join(ZH_FILES), ", ".join(en_files)))
        f.write("The corpus and the model trained on it are derived works of GPL-3.0+ data (fortunes-zh), so "
                "they are distributed under GPL-3.0-or-later.\n\n```\n{}\n```\n".format(
                    json.dumps(stats, indent=1, ensure_ascii=False)))
    print(json.dumps(stats, ensure_ascii=False))


if __name__ == "__main__":
    main()
