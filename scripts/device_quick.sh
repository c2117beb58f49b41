set -u
export NCCL_NVLS_ENABLE=0
tar -xJf bundle/bundle.tar.xz -C /tmp; B=/tmp/bundle
timeout 200 $B/cuda_ops_test --gtest_filter='*Linear*:*Sample*:*Graph*' 2>&1 | grep -E '^\[  (PASSED|FAILED)|Failure' -A3 | head
P512=$(python3 -c "print(','.join(str((i*7919)%150000+100) for i in range(512)))")
for g in 1 0; do
TESSERA_CUDA_GEMV=$g timeout 180 $B/tessera generate --model configs/qwen3-8b --load-format dummy --device cuda --prompt-ids "$P512" \
  --max-tokens 256 --ignore-eos --max-model-len 8192 --json 2>&1 >/tmp/d$g.json | grep -E 'Processed' | sed "s/^/gemv=$g /"
done
cmp /tmp/d1.json /tmp/d0.json && echo same-tokens || echo tokens-differ
P4K=$(python3 -c "print(','.join(str((i*104729)%150000+100) for i in range(4096)))")
P4K2=$(python3 -c "print(','.join(str((i*7907)%150000+100) for i in range(4096)))")
for at in 0 1; do
TESSERA_GEMM_AUTOTUNE=$at timeout 180 $B/tessera generate --model configs/qwen3-8b --load-format dummy --device cuda --prompt-ids "$P4K" \
  --prompt-ids "$P4K2" --prompt-ids "$P4K" --max-tokens 1 --max-num-seqs 1 --max-num-batched-tokens 4096 --max-model-len 8192 \
  --no-enable-prefix-caching --json > /tmp/prefill.json 2>/dev/null
python3 - /tmp/prefill.json $at <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"autotune={sys.argv[2]} prefill_4096_s {rows[1]['first_token_at_s'] - rows[0]['first_token_at_s']:.4f} {rows[2]['first_token_at_s'] - rows[1]['first_token_at_s']:.4f}")
PY
done
if command -v nsys >/dev/null; then echo has-nsys; fi
if command -v nsys >/dev/null; then
  timeout 200 nsys profile -t cuda --cuda-graph-trace=node -o /tmp/prof -f true $B/tessera generate --model configs/qwen3-8b --load-format dummy --device cuda --prompt-ids "$P512" \
    --max-tokens 64 --ignore-eos --max-model-len 8192 >/dev/null 2>&1
  nsys stats -r cuda_gpu_kern_sum -f csv /tmp/prof.nsys-rep 2>/dev/null | head -25 | cut -c1-220
fi
