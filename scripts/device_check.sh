#!/usr/bin/env bash
# Runs on the GPU machine, in the repo root, against a bundle made here with
#   scripts/bundle.sh --build-dir build-cuda --with-tests
# Prints the GPU, runs the CUDA op tests and the kernel benchmarks, and writes the
# logs and a summary to $OUT (the device tool brings $OUT back).
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

{
  echo "## op tests"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure|rel_err" "$OUT/cuda_ops_test.log" | head -80
  echo; echo "## gemm"; cat "$OUT/gemm_bench.log"
  echo; echo "## attention"; cat "$OUT/attention_bench.log"
} > "$OUT/summary.txt"
tail -n 80 "$OUT/summary.txt"
exit $status
