#!/usr/bin/env bash
# Where a decode step's time goes, on the GPU machine (which has no Nsight Systems): runs
# decode of the Qwen3-8B shape at batch 1 under the CUPTI kernel tracer (bench/ktrace,
# loaded through CUDA_INJECTION64_PATH; CUDA graph nodes are traced one by one) and prints
# the per-kernel summary and one decode step kernel by kernel with the idle gaps.
#   carry: ["bundle"]    command: bash scripts/device_profile.sh
# EXTRA_ENV="TESSERA_CUDA_OPTIONS=pdl=0" profiles a variant; EXTRA_ARGS="--enforce-eager" too;
# PREFILL=1 profiles the 4,096-token prefill instead.
set -u
. "$(dirname "$0")/device_prompts.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
B=/tmp/bundle
if [ "${PREFILL:-0}" = 1 ]; then
  # PREFILL=1: two 4,096-token prompts, one at a time, one token each (the model check's
  # prefill figure); the summary then covers both prefills.
  RUN=(--prompt-ids "$P4K" --prompt-ids "$P4K2" --max-tokens 1 --max-num-seqs 1 --max-num-batched-tokens 4096
       --no-enable-prefix-caching)
else
  RUN=(--prompt-ids "$P512" --max-tokens 64 --ignore-eos)
fi
env ${EXTRA_ENV:-} CUDA_INJECTION64_PATH=$B/libtessera_ktrace.so TESSERA_KTRACE=/tmp/ktrace.csv timeout 200 \
  $B/tessera generate --model configs/qwen3-8b --load-format dummy --device cuda --max-model-len 8192 "${RUN[@]}" \
  ${EXTRA_ARGS:-} 2>&1 >/dev/null | grep -E 'Processed|ktrace|rror'
python3 bench/ktrace/ktrace_report.py /tmp/ktrace.csv --first ${FIRST:-16} | tee "$OUT/profile${TAG:-}.txt"
xz -c /tmp/ktrace.csv > "$OUT/ktrace${TAG:-}.csv.xz"
