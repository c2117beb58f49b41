#!/usr/bin/env bash
# Cross-builds the CPU build for arm64 (aarch64: DGX Spark's Grace CPU, Graviton, Ampere) on a
# Debian 12 x86-64 machine and runs it under qemu-user: a set of unit tests, and `tessera generate`
# on the demo model, whose tokens must equal the x86 build's (build/cpu/bin/tessera, when built).
#
#   scripts/setup.sh --arm64      # once: the cross compiler, qemu-user-static, the arm64 -dev packages
#   scripts/arm64_check.sh        # configure build/arm64, build, test, generate
#   JOBS=4 scripts/arm64_check.sh # parallel compile jobs (default 2)
#
# Gloo's Debian package installs to /usr/lib (not a multiarch folder), so its arm64 build cannot be
# installed beside the host's: this script downloads libgloo-dev:arm64 and libgloo0:arm64 with
# `apt-get download` and unpacks them into build/arm64-deps (cmake/aarch64-linux-gnu.cmake finds
# them there). The build uses ccache when it is installed, as unity builds without precompiled
# headers. Exit status: 0 when the build, every test and the token comparison pass.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build/arm64
DEPS=build/arm64-deps
JOBS=${JOBS:-2}
TEST_BINS=(dtype_test tensor_test json_depth_test host_memory_test cpu_ops_test sampling_test
           loader_config_test loader_faults_test staged_reader_test tokenizer_unit_test)
PROMPT_IDS=1,2,3,4,5,6,7,8
log() { echo "[arm64] $*"; }

missing=()
command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null || command -v qemu-aarch64 >/dev/null || missing+=(qemu-user-static)
for lib in libfmt.so libspdlog.so libpcre2-8.so libicuuc.so libopenblas.so libcrypto.so libgtest.a; do
  [ -e "/usr/lib/aarch64-linux-gnu/$lib" ] || missing+=("$lib (arm64)")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[arm64] missing: ${missing[*]}; run scripts/setup.sh --arm64 first" >&2
  exit 1
fi
QEMU=$(command -v qemu-aarch64-static || command -v qemu-aarch64)

# Gloo for arm64, unpacked (see above); its CMake file names /usr/lib/libgloo.so.0.5.0, the host's
# path, so the unpacked copy is pointed at its own folder.
if [ ! -e "$DEPS/usr/lib/libgloo.so.0.5.0" ]; then
  log "unpacking libgloo-dev:arm64 and libgloo0:arm64 into $DEPS"
  mkdir -p "$DEPS/debs"
  (cd "$DEPS/debs" && apt-get download libgloo-dev:arm64 libgloo0:arm64)
  for deb in "$DEPS"/debs/*.deb; do dpkg -x "$deb" "$DEPS"; done
  sed -i 's|"/usr/lib/libgloo|"${_IMPORT_PREFIX}/lib/libgloo|g' "$DEPS"/usr/share/cmake/Gloo/GlooTargets-*.cmake
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  log "configuring $BUILD"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
    -DTESSERA_ARM64_EXTRA_PREFIX="$PWD/$DEPS/usr" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g0 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g0 -DNDEBUG" \
    -DTESSERA_UNITY=ON -DTESSERA_PCH=OFF "${launcher[@]}"
fi
start=$(date +%s)
log "building tessera and ${#TEST_BINS[@]} test binaries with $JOBS jobs"
cmake --build "$BUILD" -j "$JOBS" --target tessera "${TEST_BINS[@]}"
log "built in $(($(date +%s) - start)) s: $(file -b "$BUILD/bin/tessera" | cut -d, -f1-2)"

# The tests, each binary run through qemu (ctest --test-dir build/arm64 does the same through the
# toolchain's CMAKE_CROSSCOMPILING_EMULATOR, for the tests of the binaries built).
failed=0
for bin in "${TEST_BINS[@]}"; do
  path=$(find "$BUILD/tests" -type f -name "$bin" | head -1)
  [ -n "$path" ] || { log "FAIL $bin: not built"; failed=1; continue; }
  if out=$("$QEMU" "$path" --gtest_brief=1 2>&1); then
    log "pass $bin ($(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' <<<"$out" | head -1))"
  else
    log "FAIL $bin"; echo "$out" | tail -30; failed=1
  fi
done

# Greedy generation on the demo model: the token ids, compared with the x86 build's.
gen=(generate --model models/tessera-demo --prompt-ids "$PROMPT_IDS" --max-tokens 24 --temperature 0 --json)
arm=$("$QEMU" "$BUILD/bin/tessera" "${gen[@]}" 2>/dev/null) || { log "FAIL tessera generate under qemu"; exit 1; }
arm_ids=$(grep -o '"token_ids":\[[0-9,]*\]' <<<"$arm" | head -1)
log "arm64 generate: $arm_ids"
if [ -x build/cpu/bin/tessera ]; then
  x86_ids=$(build/cpu/bin/tessera "${gen[@]}" 2>/dev/null | grep -o '"token_ids":\[[0-9,]*\]' | head -1)
  log "x86   generate: $x86_ids"
  if [ -z "$arm_ids" ] || [ "$arm_ids" != "$x86_ids" ]; then log "FAIL the arm64 tokens differ from x86's"; failed=1; fi
else
  log "no build/cpu/bin/tessera: build it to compare the tokens with x86's"
fi
[ $failed -eq 0 ] && log "all passed" || log "FAILED"
exit $failed
