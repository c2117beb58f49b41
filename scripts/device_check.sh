#!/usr/bin/env bash
# Runs on the GPU machine, in the repo root, against a bundle made here with
#   scripts/bundle.sh --build-dir build-cuda --with-tests
# Prints the GPU, runs the CUDA op tests and the kernel benchmarks, and writes the
# logs and a summary to $OUT.
#   scripts/device_check.sh            # everything
#   QUICK=1 scripts/device_check.sh    # fewer benchmark shapes
#   BUNDLE=/path/to/bundle scripts/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tessera_device_check}
B=${BUNDLE:-bundle}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
q=""
[ "${QUICK:-0}" = 1 ] && q="--quick"

{
  date -u
  nvidia-smi
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
  echo "bundle commit: $(cat "$B/COMMIT" 2>/dev/null)"
  ldd "$B/cuda_ops_test" | grep -E "not found|cuda|cublas" || true
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

status=0
run() {  # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/$name.log"
  [ $rc -eq 0 ] || status=1
  return 0
}
run cuda_ops_test "$B/cuda_ops_test" --gtest_color=no
run gemm_bench "$B/gemm_bench" $q
run attention_bench "$B/attention_bench" $q
run moe_bench "$B/moe_bench" $q
[ -x "$B/gdr_bench" ] && run gdr_bench "$B/gdr_bench" $q
[ -x "$B/fp8_gemm_bench" ] && run fp8_gemm_bench "$B/fp8_gemm_bench" $q

# Model level (needs bundle/tessera, i.e. scripts/bundle.sh --with-tests): a Qwen3-8B
# shape with dummy weights. Decode: batch 1, 512-token prompt, 256 new tokens, against
# the ceiling copy bandwidth / 15.14 GB read per token. Prefill: one 4096-token prompt.
if [ -x "$B/tessera" ]; then
  M="$OUT/qwen3-8b-dummy"
  mkdir -p "$M"
  cat > "$M/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
 "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": false,
 "bos_token_id": 151643, "eos_token_id": 151645}
JSON
  G="$B/tessera generate --model $M --load-format dummy --device cuda --ignore-eos --max-model-len 8192"
  run model_decode $G --prompt-ids "$(seq -s, 1000 1511)" --max-tokens 256
  run model_prefill $G --prompt-ids "$(seq -s, 1000 5095)" --max-tokens 1 --max-num-batched-tokens 8192
  rm -rf "$M"
  copy=$(grep -o "copy: [0-9]*" "$OUT/gemm_bench.log" | grep -o "[0-9]*$")
  {
    echo "copy bandwidth ${copy} GB/s -> decode ceiling $(awk -v c="$copy" 'BEGIN{printf "%.0f", c/15.14}') tok/s (15.14 GB a token)"
    grep -h "Processed" "$OUT/model_decode.log" "$OUT/model_prefill.log"
  } > "$OUT/model.txt" 2>&1
fi

{
  echo "## op tests"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure|rel_err" "$OUT/cuda_ops_test.log" | head -80
  echo; echo "## gemm"; cat "$OUT/gemm_bench.log"
  echo; echo "## attention"; cat "$OUT/attention_bench.log"
  echo; echo "## mixture of experts"; cat "$OUT/moe_bench.log"
  [ -f "$OUT/gdr_bench.log" ] && { echo; echo "## gated delta rule"; cat "$OUT/gdr_bench.log"; }
  [ -f "$OUT/fp8_gemm_bench.log" ] && { echo; echo "## FP8 block-scaled linear"; cat "$OUT/fp8_gemm_bench.log"; }
  [ -f "$OUT/model.txt" ] && { echo; echo "## model (Qwen3-8B shape, dummy weights)"; cat "$OUT/model.txt"; }
} > "$OUT/summary.txt"
tail -n 80 "$OUT/summary.txt"
exit $status
