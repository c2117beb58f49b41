#!/usr/bin/env python3
"""Writes reference token ids from Hugging Face `tokenizers` for the C++ tokenizer tests.

Run where `tokenizers` is installed (the GPU machine), from the repo root:
  python3 tools/make_tokenizer_refs.py \
      --tokenizer qwen3=.npm-pkgs/tokenizer-qwen3/package/models \
      --tokenizer llama3_1=.npm-pkgs/tokenizer-llama3_1/package/models \
      --tokenizer deepseek_v3=.npm-pkgs/tokenizer-deepseek_v3/package/models \
      --strings tests/fixtures/tokenizer/strings.json --out-dir tests/fixtures/tokenizer --bench
Writes tests/fixtures/tokenizer/<name>_ref.json for each tokenizer:
  {"source": ..., "cases": [{"text", "ids", "ids_with_special", "decoded", "decoded_skip_special"}]}
`ids` is tokenizer.encode(text, add_special_tokens=False).ids; `decoded*` is tokenizer.decode(ids, ...).
With --bench it also prints encode MB/s on the mixed benchmark text (the same recipe as
bench/tokenizer_bench.cpp: the strings joined by newlines, repeated to at least 1 MB).
"""
import argparse
import json
import sys
import time
from pathlib import Path

from tokenizers import Tokenizer
import tokenizers


def bench_text(strings, min_bytes=1_000_000):
    """The benchmark text: all strings joined by '\n', repeated until it is at least min_bytes of UTF-8."""
    block = "\n".join(strings) + "\n"
    reps = -(-min_bytes // len(block.encode("utf-8")))
    return block * reps


def transformers_ids(model_dir, strings):
    """ids with add_special_tokens=True as transformers' AutoTokenizer gives them (bos rules from
    tokenizer_config.json), or None where transformers is missing or fails."""
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(model_dir))
        return [tok(s, add_special_tokens=True)["input_ids"] for s in strings], tok.__class__.__name__
    except Exception as e:  # the reference is optional; say why it is missing
        print(f"transformers reference skipped for {model_dir}: {e}", file=sys.stderr)
        return None, None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", action="append", required=True, metavar="NAME=DIR",
                        help="a tokenizer name and the directory holding its tokenizer.json")
    parser.add_argument("--strings", required=True, help="JSON file with {\"strings\": [...]}")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--bench", action="store_true", help="also print encode MB/s on the benchmark text")
    args = parser.parse_args()

    strings = json.loads(Path(args.strings).read_text(encoding="utf-8"))["strings"]
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for spec in args.tokenizer:
        name, _, model_dir = spec.partition("=")
        model_dir = Path(model_dir)
        tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        hf_ids, hf_class = transformers_ids(model_dir, strings)
        cases = []
        for i, text in enumerate(strings):
            ids = tok.encode(text, add_special_tokens=False).ids
            case = {
                "text": text,
                "ids": ids,
                "ids_with_special": tok.encode(text, add_special_tokens=True).ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
            if hf_ids is not None:
                case["transformers_ids_with_special"] = hf_ids[i]
            cases.append(case)
        doc = {
            "source": f"HF tokenizers {tokenizers.__version__} on {model_dir}/tokenizer.json, "
                      f"written by tools/make_tokenizer_refs.py"
                      + (f"; transformers_ids_with_special from transformers {hf_class}" if hf_class else ""),
            "tokenizer": name,
            "cases": cases,
        }
        target = out_dir / f"{name}_ref.json"
        target.write_text(json.dumps(doc, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n",
                          encoding="utf-8")
        print(f"wrote {len(cases)} cases to {target}", file=sys.stderr)

        if args.bench:
            text = bench_text(strings)
            mb = len(text.encode("utf-8")) / 1e6
            tok.encode(text[:10000], add_special_tokens=False)  # warm-up
            runs = []
            for _ in range(3):
                start = time.perf_counter()
                n = len(tok.encode(text, add_special_tokens=False).ids)
                runs.append(time.perf_counter() - start)
            lines = text.split("\n")
            start = time.perf_counter()
            tok.encode_batch(lines, add_special_tokens=False)
            batch_s = time.perf_counter() - start
            print(f"bench {name}: {mb:.2f} MB, {n} tokens; one string: {mb / min(runs):.2f} MB/s; "
                  f"encode_batch of lines (all cores): {mb / batch_s:.2f} MB/s")


if __name__ == "__main__":
    main()
