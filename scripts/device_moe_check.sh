#!/usr/bin/env bash
# The mixture-of-experts (issue 16) and hybrid (issue 17) checks on one H200, in one call, with
# the dense build before the MoE work beside it for a same-run comparison. Needs two bundles carried:
#   scripts/bundle.sh --build-dir build/cuda --with-tests --out /tmp/bundle --tar bundle/bundle.tar.xz
#   scripts/bundle.sh --build-dir <older build> --out /tmp/base --tar bundle/base.tar.xz   (optional; the dense part,
#   and moe_decode / hybrid_decode at batch 1 and 8, run it too: e.g. main's build beside a kernel branch)
#   carry: ["bundle", ".npm-pkgs/tokenizer-qwen3/package/models"]
#   command: bash scripts/device_moe_check.sh
# PARTS (default all but fixtures_bf16): tests ceil kernels moe_variants dense moe_decode moe_prefill moe_trace moe_serve
#   plan hybrid_decode hybrid_prefill hybrid_serve hybrid_prefix; moe_variants: the MoE decode kernel variants side by
#   side (moe_bench --variants: us per layer at T 1..32 with the copy figure of the same run); flagship_decode (batch 1,
#   with the base build too); flagship (issue 18's
#   serve command and the seeds' bench protocols on configs/qwen3.5-122b-a10b-fp8); fixtures_bf16 (transformers' bf16 error per
#   fixture, written into the reference.json files that come back in $OUT/fixture_refs.tar.gz); fp8_ab (FP8 decode
#   batches 1 / 20 / 64, Qwen3-8B --quantization fp8 and the flagship, this build and BASE); fp8_tests (the FP8
#   fixtures' engine, fixture and prompt-logprobs tests on CUDA); fp8_one_token (FP8 experts at one token: op
#   tests, moe_bench per CudaMoeFp8OneToken variant, flagship batch 1 beside BASE); ab_pairs (batch-1 decode of the
#   three MoE models, this build / BASE / ALT, or BUILDS="name=folder[@VAR=value...] ...", alternated PAIRS times)
set -u
. "$(dirname "$0")/device_prompts.sh"
export NCCL_NVLS_ENABLE=0
export TESSERA_TEST_FIXTURES=$PWD/tests/fixtures/models  # the test binaries were built in another tree
OUT=${OUT:-/tmp/out}
L=/tmp/moe_logs  # everything here; $OUT gets one archive (the tool brings back at most 8 files)
mkdir -p "$OUT" "$L"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
B=${B:-/tmp/bundle}  # or another extracted build (e.g. the bundle's prev/)
BASE=${BASE:-}  # or a folder holding an older build's tessera (e.g. the bundle's prev/)
if [ -z "$BASE" ] && [ -f bundle/base.tar.xz ]; then
  mkdir -p /tmp/basex && tar -xJf bundle/base.tar.xz -C /tmp/basex && BASE=$(dirname "$(find /tmp/basex -name tessera -type f | head -1)")
fi
PARTS=" ${PARTS:-tests ceil kernels moe_variants dense moe_decode moe_prefill moe_trace moe_serve plan hybrid_decode hybrid_prefill hybrid_serve hybrid_prefix} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
TOK=${TOK:-.npm-pkgs/tokenizer-qwen3/package/models}
MOE=configs/qwen3-30b-a3b
HYB=configs/qwen3.5-35b-a3b
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
rate() { grep -o 'decode [0-9.]* tok/s' "$1" | awk '{print $2}'; }

if part tests; then
  echo "== CUDA op tests, fixtures and engine tests on CUDA"
  timeout 300 $B/cuda_ops_test > "$L/cuda_ops.log" 2>&1; echo "cuda_ops_test rc=$?"
  grep -E '^\[  (PASSED|FAILED)|Failure' -A3 "$L/cuda_ops.log" | head -30
  TESSERA_TEST_DEVICE=cuda timeout 240 $B/model_fixture_test > "$L/fixture_cuda.log" 2>&1; echo "model_fixture_test rc=$?"
  grep -E '^\[  (PASSED|FAILED)|Failure' -A3 "$L/fixture_cuda.log" | grep -v '^--' | head -30
  TESSERA_TEST_DEVICE=cuda timeout 300 $B/engine_test > "$L/engine_cuda.log" 2>&1; echo "engine_test rc=$?"
  grep -E '^\[  (PASSED|FAILED)|Failure' -A3 "$L/engine_cuda.log" | head -20
fi

if part ceil; then
  echo "== copy bandwidth and bf16 GEMM rate in this run"
  python3 - <<'PY' 2>&1 | tee "$L/copy.log"
import torch
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
def med(f):
    ts = []
    for _ in range(10):
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]
print(f"copy_GBps {2 * n / med(lambda: b.copy_(a)) / 1e6:.0f}")
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); y = torch.randn_like(x)
for _ in range(3): x @ y
print(f"gemm_TFLOPs {2 * 8192**3 / med(lambda: x @ y) / 1e9:.0f}")
PY
fi
CB=$(awk '/copy_GBps/{print $2}' "$L/copy.log" 2>/dev/null)
GT=$(awk '/gemm_TFLOPs/{print $2}' "$L/copy.log" 2>/dev/null)

if part kernels; then
  echo "== MoE kernel benchmark"
  for k in $B/moe_bench $B/kernels/moe_bench; do [ -x "$k" ] && timeout 180 "$k" 2>&1 | tee "$L/moe_bench.log" | tail -30; done
  echo "== gated delta rule kernel benchmark"
  [ -x $B/gdr_bench ] && timeout 180 $B/gdr_bench 2>&1 | tee "$L/gdr_bench.log" | tail -25
  echo "== FP8 block-scaled linear against cuBLASLt per-tensor FP8"
  [ -x $B/fp8_gemm_bench ] && timeout 180 $B/fp8_gemm_bench 2>&1 | tee "$L/fp8_gemm_bench.log" | tail -40
fi

if part moe_variants; then
  echo "== MoE decode kernel variants (moe_bench --variants)"
  for k in $B/moe_bench $B/kernels/moe_bench; do
    [ -x "$k" ] && timeout 300 "$k" --variants 2>&1 | tee "$L/moe_variants.log" | grep -v '^check:' | tail -14
  done
  grep -E 'FAIL|error' "$L/moe_variants.log" | head -5
fi

gen() {  # gen BUNDLE_DIR NAME MODEL [ARGS...]
  local bin=$1 name=$2 model=$3; shift 3
  timeout 240 env ${GEN_ENV:-} $bin/tessera generate --model "$model" --load-format dummy --device cuda --max-model-len "${MAXLEN:-8192}" \
    --json "$@" > "$L/$name.json" 2> "$L/$name.log"
  echo "$name: $(grep -E 'Processed' "$L/$name.log" | sed 's/.*prompts in/prompts in/')"
}

decode_batches() {  # decode_batches NAME MODEL BATCH...: 512-token prompts, 128 new tokens, against the ceiling
  # (the bundle in $DB, default this build's)
  local name=$1 model=$2 bs i per args; shift 2
  for bs in "$@"; do
    args=()
    for i in $(seq 1 $bs); do args+=(--prompt-ids "$(prompt_ids 512 $((7919 + 2 * i)))"); done
    gen ${DB:-$B} ${name}_b$bs $model "${args[@]}" --max-tokens 128 --ignore-eos --max-num-seqs $bs ${GEN_EXTRA:-}
    per=$(rate "$L/${name}_b$bs.log")
    # batch 1 against the one-token ceiling; batch B's aggregate against its distinct-expert ceiling
    if [ "$bs" = 1 ]; then
      python3 tools/decode_ceiling.py $model ${CB:+--copy-gbps $CB} ${CEIL_EXTRA:-} --tok-s "$per" | tail -2
    else
      python3 tools/decode_ceiling.py $model ${CB:+--copy-gbps $CB} ${CEIL_EXTRA:-} --batch $bs --batch-tok-s "$(python3 -c "print($per * $bs)")" | tail -1
    fi
  done
}

if part dense; then
  echo "== dense Qwen3-8B shape: decode batch 1 (512-token prompt, 256 new) and prefill 4096, this build vs the base"
  for which in new base; do
    bin=$B; [ $which = base ] && bin=$BASE
    [ -n "$bin" ] || continue
    gen $bin dense_decode_$which configs/qwen3-8b --prompt-ids "$P512" --max-tokens 256 --ignore-eos
    gen $bin dense_prefill_$which configs/qwen3-8b --prompt-ids "$P4K" --prompt-ids "$P4K2" --max-tokens 1 \
      --max-num-seqs 1 --max-num-batched-tokens 4096 --no-enable-prefix-caching
    python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print('prefill_4096_s', round(r[1]['first_token_at_s'] - r[0]['first_token_at_s'], 4))" "$L/dense_prefill_$which.json"
    python3 tools/decode_ceiling.py configs/qwen3-8b ${CB:+--copy-gbps $CB} --tok-s "$(rate "$L/dense_decode_$which.log")" | tail -2
  done
fi

if part fp8; then
  echo "== dense Qwen3-8B shape with --quantization fp8: decode batch 1 and prefill 4096 (compare with the dense part)"
  gen $B fp8_decode configs/qwen3-8b --quantization fp8 --prompt-ids "$P512" --max-tokens 256 --ignore-eos
  gen $B fp8_prefill configs/qwen3-8b --quantization fp8 --prompt-ids "$P4K" --prompt-ids "$P4K2" --max-tokens 1 \
    --max-num-seqs 1 --max-num-batched-tokens 4096 --no-enable-prefix-caching
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print('fp8_prefill_4096_s', round(r[1]['first_token_at_s'] - r[0]['first_token_at_s'], 4))" "$L/fp8_prefill.json"
  grep -E 'FP8|Weights' "$L/fp8_decode.log" | head -1
  args=(); for i in $(seq 1 8); do args+=(--prompt-ids "$(prompt_ids 512 $((7919 + 2 * i)))"); done
  gen $B fp8_decode_b8 configs/qwen3-8b --quantization fp8 "${args[@]}" --max-tokens 128 --ignore-eos --max-num-seqs 8
  gen $B bf16_decode_b8 configs/qwen3-8b "${args[@]}" --max-tokens 128 --ignore-eos --max-num-seqs 8
  python3 tools/decode_ceiling.py configs/qwen3-8b --dtype-bytes 1 ${CB:+--copy-gbps $CB} --tok-s "$(rate "$L/fp8_decode.log")" | tail -2
fi

if part moe_decode; then
  echo "== MoE decode, Qwen3-30B-A3B shape, bf16 dummy: batch 1, 8, 32 (512-token prompts, 128 new tokens)"
  decode_batches moe_decode $MOE 1 8 32
  # the base bundle (bundle/base.tar.xz, e.g. main's build) at batch 1 and 8 in the same run, when carried
  [ -n "$BASE" ] && { echo "-- base build"; DB=$BASE decode_batches moe_decode_base $MOE 1 8; }
fi

if part moe_prefill; then
  echo "== MoE prefill, one 4096-token prompt after a warm-up"
  gen $B moe_prefill $MOE --prompt-ids "$P4K" --prompt-ids "$P4K2" --max-tokens 1 --max-num-seqs 1 \
    --max-num-batched-tokens 4096 --no-enable-prefix-caching
  PS=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(r[1]['first_token_at_s'] - r[0]['first_token_at_s'])" "$L/moe_prefill.json")
  printf 'moe_prefill_4096_s %.4f\n' "$PS"
  python3 tools/decode_ceiling.py $MOE --prefill-tokens 4096 --prefill-s "$PS" ${GT:+--gemm-tflops $GT} | grep prefill_
fi

if part moe_trace; then
  echo "== kernel trace of MoE decode (batch 1): time per kernel per step"
  KT=$(ls $B/libtessera_ktrace.so $B/kernels/libtessera_ktrace.so 2>/dev/null | head -1)
  if [ -n "$KT" ]; then
    CUDA_INJECTION64_PATH=$KT TESSERA_KTRACE=$L/moe_ktrace.csv gen $B moe_trace $MOE --prompt-ids "$P512" \
      --max-tokens 64 --ignore-eos --enforce-eager
    python3 bench/ktrace/ktrace_report.py $L/moe_ktrace.csv 2>&1 | tee "$L/moe_ktrace_report.txt" | head -40
    if [ -n "$BASE" ]; then  # the same trace of the base build, for a per-kernel comparison
      CUDA_INJECTION64_PATH=$KT TESSERA_KTRACE=$L/moe_ktrace_base.csv gen $BASE moe_trace_base $MOE --prompt-ids "$P512" \
        --max-tokens 64 --ignore-eos --enforce-eager
      python3 bench/ktrace/ktrace_report.py $L/moe_ktrace_base.csv > "$L/moe_ktrace_base_report.txt" 2>&1
      echo "-- base build: $L/moe_ktrace_base_report.txt"
    fi
  fi
fi

serve_model() {  # serve_model MODEL PORT LOGNAME [ARGS...]: starts tessera serve (dummy weights), waits for /health
  local model=$1 port=$2 log=$3; shift 3
  $B/tessera serve $model --load-format dummy --device cuda --tokenizer $TOK --port "$port" "$@" > "$L/$log.log" 2>&1 &
  SP=$!
  for i in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  grep -E 'state slot|KV cache size|Maximum concurrency|weights take|Planned' "$L/$log.log" | head -5
}

bench_256() {  # bench_256 PORT NAME: the 256-token serving run, c 1,5,10,20 x 40 and 64,256 x 256 requests
  local port=$1 name=$2 levels
  for levels in "1,5,10,20 40 low" "64,256 256 high"; do
    set -- $levels
    timeout 240 $B/tessera bench --base-url "http://127.0.0.1:$port" --concurrency "$1" --requests-per-level "$2" \
      --max-tokens 256 --temperature 0 --ignore-eos --prompt "Explain parallel computing in one sentence." \
      --json "$L/${name}_$3.json" 2>/dev/null | tail -12
  done
}

if part moe_serve; then
  echo "== MoE serving: tessera bench, c 1,5,10,20 (40 requests) and 64,256 (256 requests), max_tokens 256, --ignore-eos"
  serve_model $MOE 8012 moe_serve --max-model-len 4096 --max-num-seqs 256
  bench_256 8012 moe_bench
  kill $SP; wait $SP 2>/dev/null
fi

if part plan; then
  echo "== tessera plan vs what serve allocates (same flags, this H200)"
  for m in configs/qwen3-8b $MOE $HYB; do
    n=$(basename $m)
    timeout 120 $B/tessera plan $m --load-format dummy --device cuda --max-model-len 4096 --max-num-seqs 256 \
      > "$L/plan_$n.txt" 2>&1; echo "plan $n rc=$?"; grep -iE 'KV|token|fit' "$L/plan_$n.txt" | head -4
    timeout 180 $B/tessera generate --model $m --load-format dummy --device cuda --max-model-len 4096 \
      --max-num-seqs 256 --prompt-ids 1,2,3 --max-tokens 2 > /dev/null 2> "$L/plan_serve_$n.log"
    grep -E 'KV cache size|Maximum concurrency|Planned' "$L/plan_serve_$n.log"
  done
fi
if part fixtures_bf16; then
  echo "== transformers in bf16 against each fixture's fp32 reference (the bf16 noise floor)"
  timeout 300 python3 tools/fixture_bf16_spread.py --fixtures tests/fixtures/models --write 2>&1 | tee "$L/bf16_spread.log"
  tar czf "$OUT/fixture_refs.tar.gz" tests/fixtures/models/*/reference.json
fi

if part hybrid_decode; then
  echo "== hybrid decode, Qwen3.5-35B-A3B shape, bf16 dummy: batch 1 and 8 (512-token prompts, 128 new tokens)"
  decode_batches hybrid_decode $HYB 1 8
  [ -n "$BASE" ] && { echo "-- base build"; DB=$BASE decode_batches hybrid_decode_base $HYB 1 8; }
  grep -E 'state slot|KV cache size|Maximum concurrency' "$L/hybrid_decode_b1.log" | head -4
fi

if part hybrid_prefill; then
  echo "== hybrid prefill, one 8192-token prompt after a warm-up"
  P8K=$(prompt_ids 8192 104729); P8K2=$(prompt_ids 8192 7907)
  MAXLEN=16384 gen $B hybrid_prefill $HYB --prompt-ids "$P8K" --prompt-ids "$P8K2" --max-tokens 1 --max-num-seqs 1 \
    --max-num-batched-tokens 8192 --no-enable-prefix-caching
  PS=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(r[1]['first_token_at_s'] - r[0]['first_token_at_s'])" "$L/hybrid_prefill.json")
  printf 'hybrid_prefill_8192_s %.4f\n' "$PS"
  python3 tools/decode_ceiling.py $HYB --prefill-tokens 8192 --prefill-s "$PS" ${GT:+--gemm-tflops $GT} | grep prefill_
fi


if part hybrid_diag; then
  echo "== hybrid fixtures on CUDA, per prompt (TESSERA_TEST_VERBOSE): whole prefill, 32-token chunks"
  TESSERA_TEST_VERBOSE=1 TESSERA_TEST_DEVICE=cuda timeout 120 $B/model_fixture_test \
    --gtest_filter='*LastLogits*qwen3_next*:*Chunked*qwen3_next*:*LastLogits*qwen2_moe*:*LastLogits*qwen3_5_moe_text*' 2>&1 |
    grep -E 'max_err|Failure|actual|prompt length|OK \]|FAILED  \]' | head -40
fi

if part hybrid_serve; then
  echo "== hybrid serving: c 1,5,10,20 (40 requests) and 64,256 (256 requests), max_tokens 256, --ignore-eos"
  serve_model $HYB 8013 hybrid_serve --max-model-len 40960 --max-num-seqs 256
  bench_256 8013 hybrid_bench
  echo "-- one 32,768-token prompt"
  timeout 180 $B/tessera bench --base-url http://127.0.0.1:8013 --dataset random --random-input-len 32768 \
    --random-output-len 256 --num-prompts 2 --max-concurrency 1 --ignore-eos --tokenizer $TOK \
    --json "$L/hybrid_bench_32k.json" 2>/dev/null | tail -10
  kill $SP; wait $SP 2>/dev/null
fi

if part hybrid_prefix; then
  echo "== hybrid prefix caching: 64 requests sharing a 2,000-token prefix (+64 own tokens, 32 new), concurrency 8"
  for pc in on off; do
    flag=--enable-prefix-caching; [ $pc = off ] && flag=--no-enable-prefix-caching
    serve_model $HYB 8014 hybrid_prefix_$pc --max-model-len 8192 --max-num-seqs 64 $flag
    timeout 180 $B/tessera bench --base-url http://127.0.0.1:8014 --dataset random --random-prefix-len 2000 \
      --random-input-len 64 --random-output-len 32 --num-prompts 64 --max-concurrency 8 --ignore-eos \
      --tokenizer $TOK --json "$L/hybrid_prefix_$pc.json" 2>/dev/null | grep -iE 'ttft|request throughput' | head -4
    echo "prefix caching $pc: $(curl -s http://127.0.0.1:8014/metrics | grep -E '^[a-z:_]*(prefix_cache_hits_total|prompt_tokens_total)' | tr '\n' ' ')"
    kill $SP; wait $SP 2>/dev/null
  done
fi
if part plan_fp8; then
  echo "== tessera plan vs what serve allocates, FP8 weights (--quantization fp8, Qwen3-8B shape)"
  timeout 120 $B/tessera plan configs/qwen3-8b --quantization fp8 --load-format dummy --device cuda --max-model-len 4096 \
    --max-num-seqs 256 > "$L/plan_fp8.txt" 2>&1; echo "plan fp8 rc=$?"; grep -iE 'weights|KV|token|fit' "$L/plan_fp8.txt" | head -6
  timeout 180 $B/tessera generate --model configs/qwen3-8b --quantization fp8 --load-format dummy --device cuda \
    --max-model-len 4096 --max-num-seqs 256 --prompt-ids 1,2,3 --max-tokens 2 > /dev/null 2> "$L/plan_serve_fp8.log"
  grep -E 'KV cache size|Maximum concurrency|Planned|FP8' "$L/plan_serve_fp8.log"
fi
if part flagship_decode; then
  # The flagship's decode alone (no serve), this build and the base bundle's in the same run.
  FL=configs/qwen3.5-122b-a10b-fp8
  echo "== flagship: decode batch 1 (512-token prompt, 128 new), FP8 dummy"
  MAXLEN=4096 decode_batches flagship_decode $FL 1
  [ -n "$BASE" ] && { echo "-- base build"; MAXLEN=4096 DB=$BASE decode_batches flagship_decode_base $FL 1; }
fi

if part fp8_ab; then
  # FP8 linears between 17 rows and CudaOptions::fp8_w8a8_min_rows (W8A16 GEMM here, activation-quantising W8A8 in
  # the base build): decode batches 1, 20 and 64 of the Qwen3-8B shape with --quantization fp8 and of the flagship,
  # this build and the base bundle's in the same run, and the FP8 fixtures' engine / fixture / prompt-logprobs tests.
  FL=configs/qwen3.5-122b-a10b-fp8
  for which in new base; do
    db=$B; [ $which = base ] && db=$BASE
    [ -n "$db" ] || continue
    echo "-- $which build: Qwen3-8B --quantization fp8"
    GEN_EXTRA="--quantization fp8" CEIL_EXTRA=--fp8 MAXLEN=4096 DB=$db decode_batches dense_fp8_$which configs/qwen3-8b ${FP8_AB_BATCHES:-1 20 64}
    echo "-- $which build: $FL"
    MAXLEN=4096 DB=$db decode_batches flagship_$which $FL ${FP8_AB_BATCHES:-1 20 64}
  done
fi

if part fp8_tests; then
  echo "== FP8 fixtures on CUDA: engine, fixture and prompt-logprobs tests"
  for t in engine_test model_fixture_test prompt_logprobs_test; do
    TESSERA_TEST_DEVICE=cuda timeout 300 $B/$t --gtest_filter='*fp8*' > "$L/${t}_fp8.log" 2>&1; echo "$t (fp8) rc=$?"
    grep -E '^\[  (PASSED|FAILED)|Failure' -A3 "$L/${t}_fp8.log" | head -24
  done
fi

if part fp8_one_token; then
  # FP8 experts at one token (CudaMoeFp8OneToken): the bit-for-bit op tests, moe_bench at the flagship's and
  # Qwen3-30B-A3B's shapes with each variant, then the flagship's batch-1 decode (and BASE's when carried).
  echo "== FP8 experts at one token"
  timeout 300 $B/cuda_ops_test --gtest_filter='*Fp8Moe*:*MoeOneToken*' > "$L/fp8_one_token_ops.log" 2>&1
  echo "cuda_ops_test rc=$?"; grep -E '^\[  (PASSED|FAILED)|Failure' -A3 "$L/fp8_one_token_ops.log" | head -20
  for v in ${FP8_VARIANTS:-grouped shallow deep fine fine_wide}; do
    for m in qwen3.5-122b-a10b qwen3-30b-a3b; do
      echo "-- $v, $m"
      timeout 200 $B/moe_bench --quick --model $m --dtype fp8 --fp8-one-token $v 2>&1 | grep -E '^(mma|gemv|split|auto)? *1 ' | head -2
    done
  done
  FL=configs/qwen3.5-122b-a10b-fp8
  MAXLEN=4096 decode_batches flagship_one_token $FL 1
  [ -n "$BASE" ] && MAXLEN=4096 DB=$BASE decode_batches flagship_one_token_base $FL 1
fi

if part ab_pairs; then
  # Batch-1 decode of Qwen3-30B-A3B, Qwen3.5-35B-A3B and the flagship, alternating this build with BASE (and ALT, a
  # third build's folder, when set; or BUILDS="name=folder ..." for any list) PAIRS times, so a small difference
  # shows against the run-to-run spread.
  FL=configs/qwen3.5-122b-a10b-fp8
  BUILDS=${BUILDS:-"new=$B${BASE:+ base=$BASE}${ALT:+ alt=$ALT}"}
  for m in ${AB_MODELS:-$MOE $HYB $FL}; do
    echo "== alternating batch-1 decode: $m ($BUILDS)"
    for r in $(seq 1 ${PAIRS:-3}); do
      for nb in $BUILDS; do
        which=${nb%%=*} db=${nb#*=} ge=""
        # name=folder@VAR=value@...: that build run with those environment variables (A/B of an env switch)
        if [[ "$db" == *@* ]]; then ge=${db#*@}; ge=${ge//@/ }; db=${db%%@*}; fi
        GEN_ENV="$ge" MAXLEN=4096 DB=$db decode_batches ab_$(basename $m)_${which}_$r $m 1 | grep -v '^ab_'
        echo "$which $r $(rate "$L/ab_$(basename $m)_${which}_${r}_b1.log") tok/s"
      done
    done
  done
fi

if part flagship; then
  # Issue 18: the seeds' model on one H200 with the issue's command (dummy FP8 weights, the Qwen3 tokenizer).
  FL=configs/qwen3.5-122b-a10b-fp8
  echo "== flagship: decode batch 1 and 20 (512-token prompts, 128 new), FP8 dummy"
  MAXLEN=4096 decode_batches flagship_decode $FL 1 20
  grep -E 'FP8|weights take|state slot|KV cache size' "$L/flagship_decode_b1.log" | head -4
  echo "== flagship serve: $FL --language-model-only --kv-cache-dtype fp8 --max-model-len 262144 --gpu-memory-utilization 0.95"
  serve_model $FL 8015 flagship_serve --language-model-only --kv-cache-dtype fp8 --max-model-len 262144 \
    --gpu-memory-utilization 0.95
  echo "-- seed-003 protocol (tessera bench defaults: c 1,5,10,20; 40 requests; max_tokens 64; temperature 0)"
  timeout 300 $B/tessera bench --base-url http://127.0.0.1:8015 --json "$L/flagship_seed003.json" 2>/dev/null | tail -12
  echo "-- seed-000 protocol (random dataset, 100 prompts, request rate 8; vLLM's random defaults 1024 in / 128 out)"
  timeout 300 $B/tessera bench --base-url http://127.0.0.1:8015 --dataset random --num-prompts 100 --request-rate 8 \
    --tokenizer $TOK --json "$L/flagship_seed000.json" 2>/dev/null | tail -14
  kill $SP; wait $SP 2>/dev/null
fi
tar czf "$OUT/moe_logs.tar.gz" -C "$L" . && ls -la "$OUT"
