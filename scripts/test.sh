#!/usr/bin/env bash
# Runs the test suite of the CPU build (scripts/setup.sh first).  --asan: the sanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=cpu
[ "${1:-}" = "--asan" ] && preset=asan
if [ "$preset" = asan ]; then
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j "$(nproc)"
fi
ctest --preset "$preset" -j "$(nproc)"
