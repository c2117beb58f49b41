#!/usr/bin/env python3
"""A reader written for `vllm bench serve --save-result` JSON (vllm/benchmarks/serve.py's keys), as people keep
in their benchmark scripts: loads the file and checks the figures are those of the run asked for.

  bench_vllm_result.py FILE --num-prompts N --output-len L [--request-rate R] [--max-concurrency C]
                       [--percentiles 99] [--metrics ttft,tpot,itl] [--detailed] [--metadata K=V ...]
"""
import argparse
import json
import math
import sys

parser = argparse.ArgumentParser()
parser.add_argument("file")
parser.add_argument("--num-prompts", type=int, required=True)
parser.add_argument("--output-len", type=int, required=True)
parser.add_argument("--request-rate", default="inf")
parser.add_argument("--max-concurrency", type=int, default=None)
parser.add_argument("--percentiles", default="99")
parser.add_argument("--metrics", default="ttft,tpot,itl")
parser.add_argument("--detailed", action="store_true")
parser.add_argument("--metadata", nargs="*", default=[])
args = parser.parse_args()

with open(args.file) as f:
    result = json.load(f)

# The summary a vLLM user's script prints.
print("{:<40} {:<10}".format("Successful requests:", result["completed"]))
print("{:<40} {:<10.2f}".format("Benchmark duration (s):", result["duration"]))
print("{:<40} {:<10}".format("Total input tokens:", result["total_input_tokens"]))
print("{:<40} {:<10}".format("Total generated tokens:", result["total_output_tokens"]))
print("{:<40} {:<10.2f}".format("Request throughput (req/s):", result["request_throughput"]))
print("{:<40} {:<10.2f}".format("Output token throughput (tok/s):", result["output_throughput"]))
print("{:<40} {:<10.2f}".format("Total Token throughput (tok/s):", result["total_token_throughput"]))
for metric in args.metrics.split(","):
    print("{:<40} {:<10.2f}".format(f"Mean {metric} (ms):", result[f"mean_{metric}_ms"]))
    print("{:<40} {:<10.2f}".format(f"Median {metric} (ms):", result[f"median_{metric}_ms"]))
    print("{:<40} {:<10.2f}".format(f"Std {metric} (ms):", result[f"std_{metric}_ms"]))
    for p in args.percentiles.split(","):
        print("{:<40} {:<10.2f}".format(f"P{p} {metric} (ms):", result[f"p{p}_{metric}_ms"]))

problems = []
def check(ok, what):
    if not ok:
        problems.append(what)

for key in ("date", "backend", "endpoint_type", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
            "burstiness", "max_concurrency", "failed", "request_goodput", "max_output_tokens_per_s",
            "max_concurrent_requests", "latencies"):
    check(key in result, f"no {key}")
check(result["num_prompts"] == args.num_prompts, f"num_prompts {result['num_prompts']}")
check(result["completed"] == args.num_prompts and result["failed"] == 0, f"completed {result['completed']}")
check(result["total_output_tokens"] == args.num_prompts * args.output_len,
      f"total_output_tokens {result['total_output_tokens']}, want {args.num_prompts * args.output_len}")
check(result["total_input_tokens"] > 0, "no input tokens")
check(math.isclose(result["request_throughput"], result["completed"] / result["duration"], rel_tol=1e-6),
      "request_throughput is not completed / duration")
check(math.isclose(result["output_throughput"], result["total_output_tokens"] / result["duration"], rel_tol=1e-6),
      "output_throughput is not total_output_tokens / duration")
check(str(result["request_rate"]) == args.request_rate or result["request_rate"] == float(args.request_rate),
      f"request_rate {result['request_rate']}")
check(result["max_concurrency"] == args.max_concurrency, f"max_concurrency {result['max_concurrency']}")
for metric in args.metrics.split(","):
    values = [result[f"p{p}_{metric}_ms"] for p in args.percentiles.split(",")]
    check(values == sorted(values), f"{metric} percentiles not ascending: {values}")
    check(result[f"mean_{metric}_ms"] > 0, f"mean_{metric}_ms is 0")
check(len(result["latencies"]) == args.num_prompts, "latencies is not one per request")
if args.detailed:
    for key in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
        check(len(result.get(key, [])) == args.num_prompts, f"{key} is not one per request")
    check(all(n == args.output_len for n in result["output_lens"]), f"output_lens {result['output_lens']}")
else:
    check("ttfts" not in result and "itls" not in result, "per-request lists without --save-detailed")
for item in args.metadata:
    key, value = item.split("=", 1)
    check(result.get(key) == value, f"metadata {key}")
if problems:
    print("FAIL: " + "; ".join(problems))
    sys.exit(1)
print("PASS: read as vLLM's result JSON")
