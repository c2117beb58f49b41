#!/usr/bin/env bash
# Run by server_run.sh (the tiny dummy Qwen3, served as qwen3-tiny): vLLM's documented `vllm bench serve` command
# lines with the binary name swapped (and --model / --port for this server): random and ShareGPT datasets,
# --save-result with --result-dir / --result-filename, vLLM's default file name, --percentile-metrics /
# --metric-percentiles, --save-detailed, --append-result. Each prints vLLM's result block, and its result JSON
# loads in bench_vllm_result.py, a script written against vLLM's result JSON keys.
#   bench_vllm_compat.sh TESSERA_BIN
set -uo pipefail
BIN=${1:?usage: bench_vllm_compat.sh TESSERA_BIN}
HERE="$(cd "$(dirname "$0")" && pwd)"
PORT=${TESSERA_URL##*:}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
export OPENAI_API_KEY="$TESSERA_API_KEY"

run() {  # run NAME ARGS...: a `vllm bench serve` command line as `tessera bench`
  local name=$1; shift
  (cd "$TMP" && "$BIN" bench "$@" --port "$PORT") >"$TMP/$name.out" 2>"$TMP/$name.err" ||
    bad "$name: exit $?: $(tail -5 "$TMP/$name.err")"
  grep -q "============ Serving Benchmark Result ============" "$TMP/$name.out" ||
    bad "$name: no vLLM result block: $(cat "$TMP/$name.out")"
  grep -qE "^Successful requests: +[1-9]" "$TMP/$name.out" || bad "$name: no successful requests"
}

# vLLM's docs (benchmarks/README, "vllm bench serve"): random prompts, results saved under a chosen name.
run random --backend vllm --model qwen3-tiny --dataset-name random --random-input-len 32 --random-output-len 8 \
  --num-prompts 12 --request-rate 20 --save-result --result-dir "$TMP/results" --result-filename random.json
python3 "$HERE/bench_vllm_result.py" "$TMP/results/random.json" --num-prompts 12 --output-len 8 --request-rate 20 ||
  bad "random.json does not read as vLLM's result"

# ShareGPT file with --sharegpt-output-len, chat endpoint, max concurrency, percentiles of four metrics; vLLM's
# default file name.
python3 - "$TMP/sharegpt.json" <<'PY'
import json, sys
conv = lambda q, a: {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
json.dump([conv("Tell me about the sea.", "The sea is large."), conv("What is a cat?", "A small animal."),
           conv("Count to three.", "One, two, three.")], open(sys.argv[1], "w"))
PY
run sharegpt --backend openai-chat --endpoint /v1/chat/completions --model qwen3-tiny --dataset-name sharegpt \
  --dataset-path "$TMP/sharegpt.json" --sharegpt-output-len 6 --num-prompts 6 --max-concurrency 2 \
  --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --save-result --save-detailed \
  --label tessera-test --metadata tp=1 gpu=none --disable-tqdm --ignore-eos
file=$(ls "$TMP"/tessera-test-infqps-concurrency2-qwen3-tiny-*.json 2>/dev/null | head -1)
[ -n "$file" ] || bad "no result under vLLM's default name: $(ls "$TMP")"
[ -n "$file" ] && { python3 "$HERE/bench_vllm_result.py" "$file" --num-prompts 6 --output-len 6 --max-concurrency 2 \
  --percentiles 50,90,99 --metrics ttft,tpot,itl,e2el --detailed --metadata tp=1 || bad "$file does not read"; }
grep -qE "^P90 E2EL \(ms\): +[0-9]" "$TMP/sharegpt.out" || bad "no P90 E2EL line: $(cat "$TMP/sharegpt.out")"

# --append-result adds a line per run.
for _ in 1 2; do
  run append --model qwen3-tiny --dataset-name random --input-len 16 --output-len 4 --num-prompts 3 \
    --append-result --result-filename appended.json
done
python3 -c "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]; assert len(rows)==2, rows" \
    "$TMP/appended.json" || bad "--append-result did not write two lines"

# A flag mistake is one error line with exit code 2.
"$BIN" bench --port "$PORT" --metric-percentiles 150 --dataset-name random --num-prompts 1 >"$TMP/e.out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "^error: --metric-percentiles: '150' is not a percentile" "$TMP/e.out" ||
  bad "--metric-percentiles 150: exit $rc: $(cat "$TMP/e.out")"
[ $fail = 0 ] && echo "PASS: vLLM bench command lines and result JSON"
exit $fail
