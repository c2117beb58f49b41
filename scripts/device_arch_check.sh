#!/usr/bin/env bash
# The Blackwell (sm_120 / sm_121) tier proven on a Hopper GPU, in one call: the sm_120 profile
# (TESSERA_CUDA_OPTIONS=arch=sm120: the sm_120 row of the architecture table, no wgmma, no
# cuBLASLt block FP8, shared memory capped at 99 KiB) against the Hopper path of the same build,
# and the Hopper path against the previous build. Runs on the GPU machine from the repo root:
#   scripts/bundle.sh --build-dir build/cuda --with-tests --out /tmp/bundle   (then add prev/ and
#   ptx/, see below) and tar -cJf bundle/bundle.tar.xz -C /tmp bundle;  carry: ["bundle"]
#   bash scripts/device_arch_check.sh
# Bundle layout: tessera and the test and benchmark binaries (this build); prev/tessera (the
# previous build, optional: the Hopper no-change figures); ptx/cuda_ops_test, ptx/model_fixture_test, ptx/engine_test and ptx/tessera
# (optional: a build of tessera's kernels as compute_90 PTX only, so the driver compiles them,
# the JIT path of a GPU without a cubin, while cuBLAS keeps its own cubins); arch/tessera (optional:
# the default three-architecture build, for the elf part: bundle/arch.tar.xz extracted over the bundle).
# PARTS (default all, in this order): elf ops (models: the model and engine tests beside the op
# tests, on the Hopper path and the sm_120 profile) bench decode prefill serve ptx. DEADLINE
# (seconds, default 540): a part that would start after it is skipped, and each command's timeout
# ends by it, so the logs come back within one call. ROUNDS (default 1): decode rounds. The
# flagship runs whole where it fits (about 139 GB: H200) and cut to LAYERS (default 24) of its 48
# layers elsewhere; FLAGSHIP_CUT=1 cuts it on any GPU. SERVE_RUNS (default sm120): which of
# "sm120 hopper prev ptx" serve the seeds' protocol (ptx: ptx/tessera under the profile); DECODE_RUNS (default "prev hopper sm120") decode;
# BATCHES (e.g. "8 32"): decode batch sizes besides 1 (output tok/s).
set -u
DEADLINE=${DEADLINE:-540}
left() { echo $((DEADLINE - SECONDS)); }
# t SECONDS: a timeout that ends by the deadline.
t() { local l=$(($(left) - 5)); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 1 ? l : 1)); }
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
L=/tmp/arch_logs
mkdir -p "$OUT" "$L"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
B=${BUNDLE:-/tmp/bundle}
PREV=${PREV:-$B/prev/tessera}
# The previous build's and the PTX-only build's binaries find the bundle's libraries through
# their rpath ($ORIGIN/lib).
for d in prev ptx arch; do [ -d "$B/$d" ] && [ ! -e "$B/$d/lib" ] && ln -s ../lib "$B/$d/lib"; done
PARTS=" ${PARTS:-elf ops models bench decode prefill serve ptx} "
part() { [[ "$PARTS" == *" $1 "* ]] && [ "$(left)" -gt 20 ]; }
. "$(dirname "$0")/device_prompts.sh"
SM120=arch=sm120
S="$OUT/summary.txt"
say() { echo "$*" | tee -a "$S"; }
gtest_line() { grep -E "^\[  (PASSED|FAILED)  \]|tests? ran" "$1" | tr '\n' ' '; }

say "== $(date -u +%F) $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
say "build: $($B/tessera --version | tr '\n' ' ')"

if part elf; then
  command -v cuobjdump >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
  # arch/tessera (optional): the default three-architecture build, whose fatbin is the claim.
  ELF=$B/tessera
  [ -x "$B/arch/tessera" ] && ELF=$B/arch/tessera
  cuobjdump --list-elf --list-ptx "$ELF" > "$L/elf.txt" 2>&1
  say "$ELF's fatbin: $(grep -oE 'sm_[0-9]+a?|compute_[0-9]+a?' "$L/elf.txt" | sort | uniq -c | tr -s ' \n' ' ')"
  say "$("$ELF" --version | tr '\n' ' ')"
fi

# The test suites, the Hopper path and the sm_120 profile side by side (each process checks
# against the CPU on the host, so they share the GPU without timing anything).
if part ops; then
  timeout $(t 300) "$B/cuda_ops_test" --gtest_color=no > "$L/ops_hopper.log" 2>&1 &
  p1=$!
  TESSERA_CUDA_OPTIONS=$SM120 timeout $(t 300) "$B/cuda_ops_test" --gtest_color=no > "$L/ops_sm120.log" 2>&1 &
  p2=$!
  for t in model_fixture_test engine_test; do
    if part models && [ -x "$B/$t" ]; then
      TESSERA_CUDA_OPTIONS=$SM120 TESSERA_TEST_DEVICE=cuda timeout $(t 300) "$B/$t" --gtest_color=no \
        > "$L/${t}_sm120.log" 2>&1 &
      TESSERA_TEST_DEVICE=cuda timeout $(t 300) "$B/$t" --gtest_color=no > "$L/${t}_hopper.log" 2>&1 &
    fi
  done
  wait $p1
  say "cuda_ops_test (Hopper path) rc=$?: $(gtest_line "$L/ops_hopper.log")"
  wait $p2
  say "cuda_ops_test (sm_120 profile) rc=$?: $(gtest_line "$L/ops_sm120.log")"
  wait
  for t in model_fixture_test engine_test; do
    [ -f "$L/${t}_hopper.log" ] && say "$t (Hopper path): $(gtest_line "$L/${t}_hopper.log")"
    [ -f "$L/${t}_sm120.log" ] && say "$t (sm_120 profile): $(gtest_line "$L/${t}_sm120.log")"
  done
  grep -hE "^\[  FAILED  \]" "$L"/*.log | sort -u | head -30 | tee -a "$S"
fi

if part bench; then
  timeout $(t 60) "$B/fp8_gemm_bench" --quick > "$L/fp8_hopper.log" 2>&1
  TESSERA_CUDA_OPTIONS=$SM120 timeout $(t 60) "$B/fp8_gemm_bench" --quick > "$L/fp8_sm120.log" 2>&1
  say "fp8_gemm_bench: Hopper path and sm_120 profile in $L/fp8_{hopper,sm120}.log"
fi

# The flagship, whole or cut to LAYERS layers (its layer types cut alike), dummy FP8 weights.
FLAG=configs/qwen3.5-122b-a10b-fp8
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${total_mib:-0}" -lt 120000 ] || [ "${FLAGSHIP_CUT:-0}" = 1 ]; then
  FLAG=/tmp/flagship_cut
  mkdir -p $FLAG
  python3 tools/cut_layers.py configs/qwen3.5-122b-a10b-fp8 $FLAG "${LAYERS:-24}"
  say "flagship cut to ${LAYERS:-24} layers ($total_mib MiB GPU)"
fi

decode() {  # label env binary: batch 1 (P512), and BATCHES' other sizes (distinct 512-token prompts)
  local tag=$1 env=$2 bin=$3 n
  env TESSERA_CUDA_OPTIONS="$env" timeout $(t 120) "$bin" generate --model $FLAG --load-format dummy --device cuda \
    --prompt-ids "$P512" --max-tokens 256 --ignore-eos --max-model-len 4096 --json > "$L/decode_$tag.json" \
    2> "$L/decode_$tag.log"
  say "flagship decode b1 $tag: $(grep -o 'decode [0-9.]* tok/s' "$L/decode_$tag.log" | tail -1)"
  for n in ${BATCHES:-}; do
    local args=() j
    for j in $(seq 1 "$n"); do args+=(--prompt-ids "$(prompt_ids 512 $((7919 + j)))"); done
    env TESSERA_CUDA_OPTIONS="$env" timeout $(t 120) "$bin" generate --model $FLAG --load-format dummy --device cuda \
      "${args[@]}" --max-tokens 256 --ignore-eos --max-model-len 4096 --max-num-seqs "$n" --json \
      > "$L/decode_${tag}_b$n.json" 2> "$L/decode_${tag}_b$n.log"
    say "flagship decode b$n $tag: $(grep -oE 'output [0-9.]* tok/s' "$L/decode_${tag}_b$n.log" | tail -1)"
  done
}
prefill() {
  local tag=$1 env=$2
  env TESSERA_CUDA_OPTIONS="$env" timeout $(t 120) "$B/tessera" generate --model $FLAG --load-format dummy --device cuda \
    --prompt-ids "$P4K" --prompt-ids "$P4K2" --max-tokens 1 --max-num-seqs 1 --max-num-batched-tokens 4096 \
    --max-model-len 8192 --no-enable-prefix-caching --json > "$L/prefill_$tag.json" 2> "$L/prefill_$tag.log"
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print('flagship prefill 4096 $tag: %.4f s' % (r[1]['first_token_at_s'] - r[0]['first_token_at_s']))" "$L/prefill_$tag.json" | tee -a "$S"
}
if part decode; then
  runs=" ${DECODE_RUNS:-prev hopper sm120} "
  for r in $(seq 1 "${ROUNDS:-1}"); do
    [[ "$runs" == *" prev "* ]] && [ -x "$PREV" ] && decode "prev_r$r" "" "$PREV"
    [[ "$runs" == *" hopper "* ]] && decode "hopper_r$r" "" "$B/tessera"
    [[ "$runs" == *" sm120 "* ]] && decode "sm120_r$r" $SM120 "$B/tessera"
  done
  for other in prev sm120; do
    [ -f "$L/decode_${other}_r1.json" ] && [ -f "$L/decode_hopper_r1.json" ] || continue
    [ "$(first_ids "$L/decode_hopper_r1.json")" = "$(first_ids "$L/decode_${other}_r1.json")" ] \
      && say "flagship: $other and the Hopper path generate identical tokens" \
      || say "flagship: $other and the Hopper path generate different tokens"
  done
fi
if part prefill; then
  prefill hopper ""
  prefill sm120 $SM120
fi

serve() {  # label env [binary]: the seeds' protocol (max_tokens 64, one sentence, 40 requests a level at 1/5/10/20)
  local tag=$1 env=$2 bin=${3:-$B/tessera}
  env TESSERA_CUDA_OPTIONS="$env" "$bin" serve $FLAG --load-format dummy --device cuda \
    --tokenizer .npm-pkgs/tokenizer-qwen3/package/models --port 8013 --max-model-len 4096 --max-num-seqs 64 \
    --speculative-config '{"method":"mtp","num_speculative_tokens":2}' > "$L/serve_$tag.log" 2>&1 &
  local sp=$!
  for i in $(seq 1 "$(t 180)"); do curl -sf http://127.0.0.1:8013/health > /dev/null && break; sleep 1; done
  timeout $(t 150) "$B/tessera" bench --base-url http://127.0.0.1:8013 --concurrency 1,5,10,20 --requests-per-level 40 \
    --max-tokens 64 --prompt "Explain parallel computing in one sentence." --json "$L/bench_$tag.json" \
    > "$L/bench_$tag.txt" 2>&1
  kill $sp
  wait $sp 2> /dev/null
  python3 - "$L/bench_$tag.json" "$tag" <<'PY' | tee -a "$S"
import json, sys
d = json.load(open(sys.argv[1]))
out = [f"c{l['max_concurrency']} {l['completion_token_throughput']:.1f} tok/s" + (f" FAILED {l['failed']}" if l["failed"] else "")
       for l in d["levels"]]
print(f"flagship seed-003 protocol, MTP k=2, {sys.argv[2]}: " + ", ".join(out))
PY
}
if part serve; then
  [ -d .npm-pkgs/tokenizer-qwen3 ] || say "serve: no .npm-pkgs/tokenizer-qwen3 carried"
  for tag in ${SERVE_RUNS:-sm120}; do
    case $tag in
      sm120) serve sm120 $SM120 ;;
      hopper) serve hopper "" ;;
      prev) [ -x "$PREV" ] && serve prev "" "$PREV" ;;
      # The PTX-only build under the profile: the driver compiles tessera's PTX at first use (into
      # the same cache as the ptx part's, so after it the server starts from the cache).
      ptx) [ -x "$B/ptx/tessera" ] && CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/tessera_jit_cache} \
        CUDA_CACHE_MAXSIZE=4294967296 serve ptx_sm120 $SM120 "$B/ptx/tessera" ;;
    esac
  done
fi

if part ptx && [ -x "$B/ptx/cuda_ops_test" ]; then
  # No cubin for this GPU in these binaries: the driver compiles tessera's compute_90 PTX, a module at
  # its first use, into its cache (about two minutes for all of them on 16 cores). Five filtered runs
  # of the op test at once fill the cache in parallel; the suites then run from it.
  export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/tessera_jit_cache} CUDA_CACHE_MAXSIZE=4294967296
  i=0
  for f in '*Attention*:*attention*' '*Moe*:*moe*' '*Fp8*:*fp8*:*Linear*:*Gemm*' '*GatedDelta*:*Gdr*:*Conv*' \
    '-*Attention*:*attention*:*Moe*:*moe*:*Fp8*:*fp8*:*GatedDelta*:*Gdr*:*Conv*:*Linear*:*Gemm*'; do
    i=$((i + 1))
    TESSERA_CUDA_OPTIONS=$SM120 timeout $(t 200) "$B/ptx/cuda_ops_test" --gtest_filter="$f" --gtest_color=no \
      > "$L/ptx_warm$i.log" 2>&1 &
  done
  wait
  say "PTX-only build, the driver's compiles done at ${SECONDS}s: $(cat "$L"/ptx_warm*.log | grep -c '^\[       OK')" \
    "op tests passed on the way; cache $(du -sh "$CUDA_CACHE_PATH" | cut -f1)"
  TESSERA_CUDA_OPTIONS=$SM120 timeout $(t 200) "$B/ptx/cuda_ops_test" --gtest_color=no > "$L/ops_ptx_sm120.log" 2>&1 &
  timeout $(t 200) "$B/ptx/cuda_ops_test" --gtest_color=no > "$L/ops_ptx.log" 2>&1 &
  for t in model_fixture_test engine_test; do
    [ -x "$B/ptx/$t" ] && TESSERA_CUDA_OPTIONS=$SM120 TESSERA_TEST_DEVICE=cuda timeout $(t 200) "$B/ptx/$t" \
      --gtest_color=no > "$L/${t}_ptx_sm120.log" 2>&1 &
  done
  wait
  say "cuda_ops_test (PTX-only build, sm_120 profile): $(gtest_line "$L/ops_ptx_sm120.log")"
  say "cuda_ops_test (PTX-only build, sm_90 row): $(gtest_line "$L/ops_ptx.log")"
  for t in model_fixture_test engine_test; do
    [ -f "$L/${t}_ptx_sm120.log" ] && say "$t (PTX-only build, sm_120 profile): $(gtest_line "$L/${t}_ptx_sm120.log")"
  done
  if [ -x "$B/ptx/tessera" ]; then
    # The demo model when its weights travelled, else a hybrid MoE fixture (token ids, no tokenizer).
    if [ -f models/tessera-demo/model.safetensors ]; then
      ptx_model=(--model models/tessera-demo --prompt "床前明月光")
    else
      ptx_model=(--model tests/fixtures/models/qwen3_5_moe_text_tiny --prompt-ids 1,2,3,4,5,6,7,8)
    fi
    TESSERA_CUDA_OPTIONS=$SM120 timeout $(t 100) "$B/ptx/tessera" generate "${ptx_model[@]}" --device cuda \
      --max-tokens 24 --temperature 0 > "$L/ptx_demo.txt" 2> "$L/ptx_demo.log"
    say "${ptx_model[1]} on the PTX-only build (sm_120 profile): rc=$? $(head -c 200 "$L/ptx_demo.txt" | tr '\n' ' ')"
    grep -h "kernels:" "$L/ptx_demo.log" | head -1 | tee -a "$S"
  fi
fi

say "elapsed ${SECONDS}s of DEADLINE ${DEADLINE}s"
tar -czf "$OUT/arch_logs.tgz" -C /tmp arch_logs
cat "$S"
