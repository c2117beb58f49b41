#!/usr/bin/env bash
# `tessera serve` plans before it allocates: Qwen3-8B (configs/qwen3-8b: config.json only, no
# weights) on the CPU backend with --gpu-memory 4GiB cannot hold its 30 GiB of f32 weights.
# The server must exit non-zero within 5 s, with an error naming the flag to change, before
# any weight is initialised or read.
#   serve_plan_fails_fast.sh TESSERA_BIN
set -uo pipefail
BIN=${1:?usage: serve_plan_fails_fast.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOK="$ROOT/.npm-pkgs/tokenizer-qwen3/package/models"
if [ ! -f "$TOK/tokenizer.json" ]; then echo "SKIP: $TOK/tokenizer.json missing (run scripts/fetch_test_data.sh)"; exit 77; fi
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
fail=0
for fmt in dummy auto; do
  start=$(date +%s.%N)
  timeout 30 "$BIN" serve "$ROOT/configs/qwen3-8b" --tokenizer "$TOK" --device cpu --load-format $fmt \
    --gpu-memory 4GiB --port 0 >"$LOG" 2>&1
  rc=$?
  secs=$(python3 -c "import sys,time; print(f'{time.time()-float(sys.argv[1]):.2f}')" "$start")
  echo "--load-format $fmt: exit $rc after $secs s"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "FAIL: exit $rc"; fail=1; }
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 5 else 1)" "$secs" || { echo "FAIL: took $secs s"; fail=1; }
  grep -q "error: this configuration cannot fit" "$LOG" || { echo "FAIL: no plan error"; fail=1; }
  grep -q -- "--tensor-parallel-size" "$LOG" || { echo "FAIL: the error names no flag"; fail=1; }
  grep -q -- "30.5[0-9] GiB for weights" "$LOG" || { echo "FAIL: the weights are not counted"; fail=1; }
  if grep -qE "Initialising dummy weights|Loading safetensors|Loading weights took" "$LOG"; then
    echo "FAIL: weights were touched"; fail=1
  fi
  [ $fail = 0 ] || cat "$LOG"
done
[ $fail = 0 ] && echo "PASS: serve fails fast"
exit $fail
