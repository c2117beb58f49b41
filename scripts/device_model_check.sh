#!/usr/bin/env bash
# Model-level checks on the GPU machine, in one call (the lead's run; kernel-level checks
# are scripts/device_check.sh). Needs the bundle (scripts/bundle.sh --with-tests --tar
# bundle/bundle.tar.xz) and the Qwen3 tokenizer carried:
#   carry: ["bundle", ".npm-pkgs/tokenizer-qwen3/package/models"]
#   command: bash scripts/device_model_check.sh
# Writes logs to $OUT and a short summary last.
set -u
. "$(dirname "$0")/device_prompts.sh"
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
B=/tmp/bundle
# PARTS: which sections to run (default all): tests demo ceil decode fp8 prefill serve
# DECODE_AB: extra decode runs, one per VAR=value (e.g. "TESSERA_CUDA_OPTIONS=pdl=0 TESSERA_CUDA_OPTIONS=moe_gemv=0").
PARTS=" ${PARTS:-tests demo ceil decode fp8 prefill serve} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
TOK=.npm-pkgs/tokenizer-qwen3/package/models
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader

if [ "${STOP_REFS:-0}" = 1 ]; then
  echo "== stop-string references (transformers StopStringCriteria)"
  timeout 120 python3 tools/make_stop_string_refs.py --tokenizer $TOK --out "$OUT/qwen3_stop_refs.json" 2>&1 | tail -2
fi

if part tests; then
echo "== CUDA op tests (sampling, graphs, every op vs CPU)"
timeout 300 $B/cuda_ops_test > "$OUT/cuda_ops.log" 2>&1; echo "cuda_ops_test rc=$?"
grep -E '^\[  (PASSED|FAILED)|Failure' -A3 "$OUT/cuda_ops.log" | head -20

echo "== fixture and engine tests on CUDA"
TESSERA_TEST_DEVICE=cuda timeout 180 $B/model_fixture_test > "$OUT/fixture_cuda.log" 2>&1; echo "model_fixture_test rc=$?"
grep -E 'PASSED|FAILED|Failure' -A3 "$OUT/fixture_cuda.log" | grep -v '^--' | head -20
TESSERA_TEST_DEVICE=cuda timeout 240 $B/engine_test > "$OUT/engine_cuda.log" 2>&1; echo "engine_test rc=$?"
grep -E '^\[  (PASSED|FAILED)' "$OUT/engine_cuda.log" | head -20

fi
if part demo; then
echo "== the demo model (models/tessera-demo) on CUDA: prompt logprobs vs a full forward; held-out perplexity"
echo "   (transformers on the H200: 1064.7710, eval.json; tessera CPU: 1064.94; the target is within 0.5%)"
TESSERA_TEST_DEVICE=cuda timeout 120 $B/prompt_logprobs_test > "$OUT/prompt_logprobs_cuda.log" 2>&1
echo "prompt_logprobs_test rc=$?"
grep -E '^\[  (PASSED|FAILED)' "$OUT/prompt_logprobs_cuda.log" | head -20
for q in "" fp8; do
  log="$OUT/demo_score${q:+_$q}.log"
  timeout 300 $B/tessera generate --model models/tessera-demo --score models/tessera-demo/heldout_texts.jsonl \
    --max-model-len 1025 ${q:+--quantization $q} > "$log" 2>&1
  echo "demo score ${q:-bf16} rc=$?: $(tail -1 "$log")"
done
fi
if part ceil; then
echo "== copy bandwidth (ceiling) in this run"
python3 - <<'PY' 2>&1 | tee "$OUT/copy.log"
import torch
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); ms = ts[len(ts) // 2]
print(f"copy_GBps {2 * n / ms / 1e6:.0f}")
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); y = torch.randn_like(x)
for _ in range(3): x @ y
torch.cuda.synchronize(); ts = []
for _ in range(10):
    s.record(); x @ y; e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); ms = ts[len(ts) // 2]
print(f"gemm_TFLOPs {2 * 8192**3 / ms / 1e9:.0f}")
PY

fi
if part decode; then
echo "== decode, batch 1, Qwen3-8B shape, 512-token prompt, 256 new tokens"
# decode_run NAME [ARGS...]: the decode run, output in $OUT/NAME.json and NAME.log.
decode_run() {
  local name=$1; shift
  timeout 180 $B/tessera generate --model configs/qwen3-8b --load-format dummy --device cuda --prompt-ids "$P512" \
    --max-tokens 256 --ignore-eos --max-model-len 8192 --json "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"
}
decode_run decode
grep -E 'Processed|KV cache size|weights take|CUDA graphs' "$OUT/decode.log"
REF_IDS=$(first_ids "$OUT/decode.json")
decode_run decode_eager --enforce-eager
echo "eager:"; grep -E 'Processed' "$OUT/decode_eager.log"
[ "$REF_IDS" = "$(first_ids "$OUT/decode_eager.json")" ] \
  && echo "graph and eager decode: identical tokens" || echo "graph and eager decode: tokens DIFFER"
# The ceiling: copy bandwidth of this run (section ceil) over the bytes a step reads.
TOKS=$(grep -o 'decode [0-9.]* tok/s' "$OUT/decode.log" | awk '{print $2}')
CB=$(awk '/copy_GBps/{print $2}' "$OUT/copy.log" 2>/dev/null)
python3 tools/decode_ceiling.py configs/qwen3-8b ${CB:+--copy-gbps $CB} ${TOKS:+--tok-s $TOKS}
# DECODE_AB="VAR=1 OTHER=0": the same decode with each setting, tokens compared with the default run.
for ab in ${DECODE_AB:-}; do
  (export "$ab"; decode_run decode_ab)
  same=$([ "$REF_IDS" = "$(first_ids "$OUT/decode_ab.json")" ] && echo "same tokens" || echo "tokens DIFFER")
  echo "$ab: $(grep -o 'decode [0-9.]* tok/s' "$OUT/decode_ab.log"), $same"
done

fi
if part fp8; then
echo "== fp8 KV cache: capacity at the same memory budget"
for dt in auto fp8; do
  timeout 120 $B/tessera generate --model configs/qwen3-8b --load-format dummy --device cuda --prompt-ids 1,2,3 \
    --max-tokens 2 --max-model-len 8192 --kv-cache-dtype $dt --gpu-memory-utilization 0.5 2>&1 | grep -E 'KV cache size' | sed "s/^/$dt: /"
done

fi
if part prefill; then
echo "== prefill, one 4096-token prompt (after a warm-up prompt), same model"
timeout 180 $B/tessera generate --model configs/qwen3-8b --load-format dummy --device cuda --prompt-ids "$P4K" \
  --prompt-ids "$P4K2" --max-tokens 1 --max-num-seqs 1 --max-num-batched-tokens 4096 --max-model-len 8192 \
  --no-enable-prefix-caching --json > "$OUT/prefill.json" 2> "$OUT/prefill.log"
  # The second prompt's prefill: from the first prompt's first token to its own.
  PS=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(r[1]['first_token_at_s'] - r[0]['first_token_at_s'])" "$OUT/prefill.json")
  printf 'prefill_4096_s %.4f\n' "$PS"
  GT=$(awk '/gemm_TFLOPs/{print $2}' "$OUT/copy.log" 2>/dev/null)
  python3 tools/decode_ceiling.py configs/qwen3-8b --prefill-tokens 4096 --prefill-s "$PS" ${GT:+--gemm-tflops $GT} | grep prefill_

fi
if part serve; then
echo "== serving: tessera bench, the 256-token serving run (c 1,5,10,20 x 40 and 64,256 x 256 requests, max_tokens 256, --ignore-eos)"
$B/tessera serve configs/qwen3-8b --load-format dummy --device cuda --tokenizer $TOK --port 8011 \
  --max-model-len 4096 --max-num-seqs 256 > "$OUT/serve.log" 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 1; done
timeout 200 $B/tessera bench --base-url http://127.0.0.1:8011 --concurrency 1,5,10,20 --requests-per-level 40 \
  --max-tokens 256 --temperature 0 --ignore-eos --prompt "Explain how a GPU schedules warps." \
  --json "$OUT/bench_low.json" 2>/dev/null | tail -12
timeout 200 $B/tessera bench --base-url http://127.0.0.1:8011 --concurrency 64,256 --requests-per-level 256 \
  --max-tokens 256 --temperature 0 --ignore-eos --prompt "Explain how a GPU schedules warps." \
  --json "$OUT/bench_high.json" 2>/dev/null | tail -10
kill $SP; wait $SP 2>/dev/null
grep -E 'KV cache size|Maximum concurrency' "$OUT/serve.log"
fi
