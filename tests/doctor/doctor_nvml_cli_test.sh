#!/usr/bin/env bash
# `tessera doctor` on this machine with the fake NVML (fake_nvml.cpp) found by the dynamic
# loader through LD_LIBRARY_PATH, as the real libnvidia-ml.so.1 would be: the facts it answers
# are the GPUs line, the failures it returns are named in the report (and the doctor exits
# normally); then with no NVML to load, the GPUs line says what was tried.
#   doctor_nvml_cli_test.sh TESSERA_BIN FAKE_NVML_DIR
set -uo pipefail
BIN=${1:?usage: doctor_nvml_cli_test.sh TESSERA_BIN FAKE_NVML_DIR}
FAKE_DIR=${2:?usage: doctor_nvml_cli_test.sh TESSERA_BIN FAKE_NVML_DIR}
OUT=$(mktemp -d /tmp/tessera-doctor-nvml.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
unset TESSERA_DOCTOR_NVML
TWO='NVIDIA GeForce RTX 5090 D|32607|12.0;NVIDIA GeForce RTX 5090 D|32607|12.0'

fail=0
FAIL() { echo "FAIL: $*"; fail=1; }
has() { grep -qF -- "$2" "$1" || { FAIL "$1 lacks '$2'"; echo "--- $1"; cat "$1"; }; }
lacks() { ! grep -qF -- "$2" "$1" || { FAIL "$1 has '$2'"; echo "--- $1"; cat "$1"; }; }
# doctor NAME [VAR=VALUE...]: runs the doctor (a small /dev/shm is not what this test is about)
# with the fake NVML first on the library path; the output in $OUT/NAME, its status in $OUT/NAME.rc.
doctor() {
  local name=$1
  shift
  env LD_LIBRARY_PATH="$FAKE_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@" "$BIN" doctor --min-shm 1MiB \
    >"$OUT/$name" 2>&1
  echo $? >"$OUT/$name.rc"
}

# Two RTX 5090 D, driver 580.95.05, CUDA 13.0, P2P between them.
doctor two FAKE_NVML_GPUS="$TWO" FAKE_NVML_DRIVER=580.95.05
has "$OUT/two" "✓ GPUs                     2 x NVIDIA GeForce RTX 5090 D, 32607 MiB; driver 580.95.05, CUDA 13.0"
has "$OUT/two" "✓ P2P between GPUs         1 pairs with P2P, 0 without"
has "$OUT/two" "CUDA kernels"
lacks "$OUT/two" "NVML"
[ "$(cat "$OUT/two.rc")" = 0 ] || FAIL "two GPUs: exit $(cat "$OUT/two.rc"), wanted 0"

# nvmlInit_v2 fails: named, and the kernel module tried after it.
doctor init FAKE_NVML_GPUS="$TWO" FAKE_NVML_INIT=9
has "$OUT/init" "GPUs                     no NVIDIA GPU visible: CPU backend (tried NVML: nvmlInit_v2: Driver Not Loaded (NVML error 9); /proc/driver/nvidia/version: "
[ "$(cat "$OUT/init.rc")" = 0 ] || FAIL "init error: exit $(cat "$OUT/init.rc"), wanted 0"

# Calls that fail after init: each named in the NVML line, the rest still reported.
doctor calls FAKE_NVML_GPUS="$TWO" FAKE_NVML_FAIL=nvmlDeviceGetMemoryInfo=3,nvmlDeviceGetP2PStatus=999
has "$OUT/calls" "✓ GPUs                     2 x NVIDIA GeForce RTX 5090 D; driver 580.95.05, CUDA 13.0"
has "$OUT/calls" "! P2P between GPUs         0 pairs with P2P, 0 without, 1 unknown (the query failed)"
has "$OUT/calls" "! NVML                     nvmlDeviceGetMemoryInfo (GPU 0): Not Supported (NVML error 3); nvmlDeviceGetMemoryInfo (GPU 1): Not Supported (NVML error 3); nvmlDeviceGetP2PStatus: Unknown Error (NVML error 999) (1 of 1 pairs)"
[ "$(cat "$OUT/calls.rc")" = 0 ] || FAIL "failed calls: exit $(cat "$OUT/calls.rc"), wanted 0"

# --json carries the same lines.
env LD_LIBRARY_PATH="$FAKE_DIR" FAKE_NVML_GPUS="$TWO" "$BIN" doctor --min-shm 1MiB --json >"$OUT/json" 2>&1
has "$OUT/json" '"detail": "2 x NVIDIA GeForce RTX 5090 D, 32607 MiB; driver 580.95.05, CUDA 13.0"'

# No NVML to load (a path that does not exist instead of the fake): what was tried, no crash.
doctor none TESSERA_DOCTOR_NVML=/nonexistent/libnvidia-ml.so.1
has "$OUT/none" "GPUs                     no NVIDIA GPU visible: CPU backend (tried NVML: /nonexistent/libnvidia-ml.so.1: cannot open shared object file: No such file or directory; /proc/driver/nvidia/version: "
[ "$(cat "$OUT/none.rc")" = 0 ] || FAIL "no NVML: exit $(cat "$OUT/none.rc"), wanted 0"

[ $fail = 0 ] && echo "doctor with the fake NVML: all checks as expected"
exit $fail
