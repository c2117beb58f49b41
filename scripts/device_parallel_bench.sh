#!/usr/bin/env bash
# Serving benchmarks on 2 GPUs (issue 9): the 256-token serving run (docs/performance.md) against `tessera serve` on the
# Qwen3-8B shape (dummy bf16) at TP=2 (TP=1 figures come from scripts/device_model_check.sh),
# then over sockets only (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo, imitated
# Ethernet between machines) TP=2 against PP=2.
#   carry: ["bundle", ".npm-pkgs/tokenizer-qwen3/package/models"]   command: bash scripts/device_parallel_bench.sh
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
B=/tmp/bundle
TOK=.npm-pkgs/tokenizer-qwen3/package/models
PORT=8021
serve_bench() {  # serve_bench NAME "LEVELS:REQUESTS ..." ENV... -- SERVE FLAGS...
  local name=$1 plan=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$B/tessera" serve configs/qwen3-8b --load-format dummy --device cuda --tokenizer $TOK --port $PORT \
    --max-model-len 4096 --max-num-seqs 256 "$@" > "$OUT/serve_$name.log" 2>&1 &
  local sp=$!
  for i in $(seq 1 180); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done
  echo "== $name: $(grep -h 'rank processes' "$OUT/serve_$name.log" | head -1 | sed 's/.*\] //' | cut -c1-120)"
  for step in $plan; do
    timeout 240 "$B/tessera" bench --base-url http://127.0.0.1:$PORT --concurrency "${step%%:*}" \
      --requests-per-level "${step##*:}" --max-tokens 256 --temperature 0 --ignore-eos \
      --prompt "Explain how a GPU schedules warps." --json "$OUT/bench_${name}_${step%%:*}.json" 2>/dev/null \
      | grep -E '^ +[0-9]+ \|' | head -2
  done
  kill $sp; wait $sp 2>/dev/null
  PORT=$((PORT + 1))
}
# PLAN / SOCKET_PLAN: "concurrency:requests ..." (shorter plans when device time is short).
serve_bench tp2_nvlink "${PLAN:-1:40 5:40 10:40 20:40 64:256 256:256}" -- --tensor-parallel-size 2
S="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
serve_bench tp2_sockets "${SOCKET_PLAN:-1:16 20:40 64:64}" $S -- --tensor-parallel-size 2 --disable-custom-all-reduce
serve_bench pp2_sockets "${SOCKET_PLAN:-1:16 20:40 64:64}" $S -- --pipeline-parallel-size 2
