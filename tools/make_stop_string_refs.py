#!/usr/bin/env python3
"""Where transformers stops generation for given stop strings (run on the GPU machine):

    python3 tools/make_stop_string_refs.py --tokenizer .npm-pkgs/tokenizer-qwen3/package/models \
        --out tests/fixtures/stop/qwen3_stop_refs.json

For each case (token ids of a text, as a model would emit them, and stop strings), the
reference is the first prefix length k at which transformers' StopStringCriteria fires,
and the text decoded up to there. tessera's streaming detokenizer must stop at the same
token and cut the text right before the stop string (vLLM's output convention).
"""
import argparse
import json

import torch
from transformers import AutoTokenizer, StopStringCriteria

TEXTS = [
    "Hello world! The answer is 42.\nObservation: done",
    "def add(a, b):\n    return a + b\n\n\nclass Foo:\n    pass",
    "你好，世界。今天天气很好，我们去公园吧！结束。",
    "Step 1: think.\nStep 2: act.\nFinal Answer: yes",
    "emoji 👨‍👩‍👧‍👦 family and 🇨🇳 flag, then STOP here",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
    "The quick brown fox jumps over the lazy dog. The quick brown fox.",
]

STOPS = [
    ["Observation:"], ["\n\n\n"], ["。"], ["Final Answer"], ["STOP"], ["</tool_call>"], ["ab"], ["lazy dog"],
    ["world!", "answer"], ["return a"], ["天气"], ["Step 2"], ["🇨🇳"], ["\"city\""], ["aaab"], ["fox jumps"],
    ["nothing-matches-here"], ["x"], [" b\n"], ["公园吧"],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    cases = []
    # Building a criteria scans the whole vocabulary: once per stop set, not per text.
    criteria = [StopStringCriteria(tokenizer=tok, stop_strings=stops) for stops in STOPS]
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        for stops, crit in zip(STOPS, criteria):
            stop_at = None
            for k in range(1, len(ids) + 1):
                if bool(crit(torch.tensor([ids[:k]]), None)[0]):
                    stop_at = k
                    break
            cases.append({"ids": ids, "stop": stops, "stop_at": stop_at,
                          "text_until_stop": tok.decode(ids[:stop_at] if stop_at else ids)})
    with open(args.out, "w") as f:
        json.dump({"tokenizer": args.tokenizer, "cases": cases}, f, ensure_ascii=False, indent=0)
    print(f"{len(cases)} cases, {sum(c['stop_at'] is not None for c in cases)} stop")


if __name__ == "__main__":
    main()
