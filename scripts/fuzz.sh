#!/usr/bin/env bash
# Runs the control-channel decoder fuzz target for N seconds (default 60) with clang's
# libFuzzer + ASan + UBSan, in its own build folder. Exits non-zero on a finding (the
# crashing input is left in build-fuzz/fuzz-artifacts/).
#   scripts/fuzz.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-60}
CC_BIN=${CC_FUZZ:-clang-14}
CXX_BIN=${CXX_FUZZ:-clang++-14}
command -v "$CXX_BIN" >/dev/null || { echo "fuzz.sh: needs $CXX_BIN (apt-get install clang-14 libclang-rt-14-dev)"; exit 2; }
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$CC_BIN" \
  -DCMAKE_CXX_COMPILER="$CXX_BIN" -DTESSERA_FUZZ=ON -DTESSERA_TESTS=ON >/dev/null
cmake --build build-fuzz --target dist_wire_fuzz -j "${FUZZ_JOBS:-2}"
mkdir -p build-fuzz/fuzz-corpus build-fuzz/fuzz-artifacts
# Seed with a valid frame of every type so the fuzzer starts past the header checks.
python3 - build-fuzz/fuzz-corpus <<'PY' || true
import struct, sys, os
out = sys.argv[1]
payloads = {1: struct.pack('<H', 1) + bytes(32), 2: bytes(64), 3: bytes(32), 6: struct.pack('<I', 3) + b'why',
            7: struct.pack('<Q', 1), 8: b'', 10: struct.pack('<QI', 5, 2) + b'ab', 11: struct.pack('<iiiI', 1, 2, 2, 0),
            12: struct.pack('<I', 1) + b'k' + struct.pack('<I', 1) + b'v', 13: struct.pack('<I', 1) + b'k',
            14: b'\x01' + struct.pack('<I', 0), 15: b'', 16: struct.pack('<Ii', 1, 0), 19: b''}
for t, p in payloads.items():
    with open(os.path.join(out, f'seed_{t}'), 'wb') as f:
        f.write(struct.pack('<IBBHI', 0x41525354, 1, t, 0, len(p)) + p)
PY
exec build-fuzz/tests/dist/dist_wire_fuzz -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -timeout=10 \
  -artifact_prefix=build-fuzz/fuzz-artifacts/ build-fuzz/fuzz-corpus
