#!/usr/bin/env bash
# Localises the CUDA fixture divergences (issues 16, 17) in one GPU call: cuda_model_check_test
# (every op of the fixtures' prompts, decode steps and the hybrid engine's 32-token case checked
# against the CPU op by op; plain CUDA with each kernel path switched off), the plain runs again
# with TESSERA_CUDA_OPTIONS=pdl=0, and the op tests. Full logs go to $OUT; the lines that pinpoint the problem
# are printed (docs/cuda.md "Localising a divergence" says how to read them). Under 10 minutes.
#
#   scripts/bundle.sh --build-dir build/cuda --with-tests     # after building cuda_model_check_test
#   # on the GPU machine, from the repository root (for tests/fixtures/models):
#   BUNDLE=bundle OUT=/tmp/diag scripts/device_fixture_diag.sh
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUNDLE:-bundle}
OUT=${OUT:-/tmp/fixture_diag}
mkdir -p "$OUT"
export TESSERA_TEST_FIXTURES=${TESSERA_TEST_FIXTURES:-$PWD/tests/fixtures/models}
for bin in cuda_model_check_test cuda_ops_test; do
  [ -x "$B/$bin" ] || { echo "device_fixture_diag: $B/$bin is missing: build it and make the bundle with --with-tests" >&2; exit 1; }
done

timeout 300 "$B/cuda_model_check_test" --gtest_color=no --gtest_filter='-*SelfTest*' > "$OUT/model_check.log" 2>&1
echo "cuda_model_check_test rc=$? (log $OUT/model_check.log)"
TESSERA_CUDA_OPTIONS=pdl=0 timeout 100 "$B/cuda_model_check_test" --gtest_color=no \
  --gtest_filter='*PlainCudaWithEachKernelPathSwitchedOff*:*EagerAndWithGraphs*' > "$OUT/model_check_no_pdl.log" 2>&1
echo "cuda_model_check_test with TESSERA_CUDA_OPTIONS=pdl=0 rc=$? (log $OUT/model_check_no_pdl.log)"
# The op tests of the suspects (the whole binary: device_check.sh).
timeout 150 "$B/cuda_ops_test" --gtest_color=no \
  --gtest_filter='*LinearAttentionStateCarried*:*SharedExpert*:*PartialTies*:*QkvAttentionHeadDim32*:*MoeExperts*:*MoeTopk*:CudaOps.Linear:*SigmoidMul*:*CausalConv1d*:Cases/CudaGatedDeltaRule.*:Cases/CudaAttention.*' \
  > "$OUT/cuda_ops.log" 2>&1
echo "cuda_ops_test rc=$? (log $OUT/cuda_ops.log)"

echo "=== op mismatches (first ones of each fixture; 'operands' and 'note' lines follow each)"
grep -A2 -E "^\[check\] MISMATCH" "$OUT/model_check.log" | head -150
echo "=== per-op summaries and first mismatches"
grep -E "^\[check\]" "$OUT/model_check.log" | grep -v MISMATCH | head -150
echo "=== end to end through the checking backend"
grep -E "^\[case\]" "$OUT/model_check.log" | head -80
echo "=== the same prompts on the CPU: bf16 activations, and one near-tied router choice flipped (no GPU involved)"
grep -E "^\[bf16-cpu\]|^\[flip\]|^\[replay-bf16-cpu\]" "$OUT/model_check.log" | head -60
echo "=== CUDA against the CPU in f32 given CUDA's routing (compare with the [replay-bf16-cpu] lines)"
grep -E "^\[replay\]" "$OUT/model_check.log" | head -40
echo "=== plain CUDA, defaults and each kernel path off"
grep -E "^\[plain" "$OUT/model_check.log" | head -200
echo "=== plain CUDA with TESSERA_CUDA_OPTIONS=pdl=0"
grep -E "^\[plain defaults\]|^\[engine\]" "$OUT/model_check_no_pdl.log" | head -80
echo "=== engine, 32-token steps"
grep -E "^\[engine\]" "$OUT/model_check.log" | head -80
echo "=== test results"
for f in model_check model_check_no_pdl cuda_ops; do
  echo "$f: $(grep -E '^\[  PASSED  \] [0-9]+ test' "$OUT/$f.log")"
  grep -E '^\[  FAILED  \] [^0-9]' "$OUT/$f.log" | sed 's/ (.*ms)$//' | sort -u | head -60
done
echo "=== cuda_ops_test failures"
grep -A4 -E ": Failure$" "$OUT/cuda_ops.log" | head -120
