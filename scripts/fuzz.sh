#!/usr/bin/env bash
# Runs each fuzz target for N seconds (default 60) with clang's libFuzzer + ASan + UBSan, in
# its own build folder: the control-channel decoders (dist_wire_fuzz), the server's request
# path (server_request_fuzz: raw HTTP through routing, auth, JSON, validation, chat template and
# tokenizer, with a stub engine), the chat-template engine (template_fuzz: the input is a template)
# and the model directory's JSON files (model_files_fuzz: config.json, generation_config.json,
# tokenizer.json, tokenizer_config.json). Exits non-zero on a finding (the input is left in
# build-fuzz/<name>-artifacts/).
#   scripts/fuzz.sh [seconds] [wire|request|template|files]   (every target when no name is given)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-60}
ONLY=${2:-}
CC_BIN=${CC_FUZZ:-clang-14}
CXX_BIN=${CXX_FUZZ:-clang++-14}
command -v "$CXX_BIN" >/dev/null || { echo "fuzz.sh: needs $CXX_BIN (apt-get install clang-14 libclang-rt-14-dev)"; exit 2; }
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_COMPILER="$CC_BIN" \
  -DCMAKE_CXX_COMPILER="$CXX_BIN" -DTESSERA_FUZZ=ON -DTESSERA_TESTS=ON >/dev/null
TOKENIZER=.npm-pkgs/tokenizer-qwen3/package/models
TARGETS=()
[ -z "$ONLY" ] || [ "$ONLY" = wire ] && TARGETS+=(dist_wire_fuzz)
[ -z "$ONLY" ] || [ "$ONLY" = template ] && TARGETS+=(template_fuzz)
[ -z "$ONLY" ] || [ "$ONLY" = files ] && TARGETS+=(model_files_fuzz)
if [ -z "$ONLY" ] || [ "$ONLY" = request ]; then
  if [ -f "$TOKENIZER/tokenizer.json" ]; then
    TARGETS+=(server_request_fuzz)
  else
    echo "fuzz.sh: $TOKENIZER missing (run scripts/fetch_test_data.sh): server_request_fuzz skipped"
  fi
fi
cmake --build build-fuzz --target "${TARGETS[@]}" -j "${FUZZ_JOBS:-2}"
if [[ " ${TARGETS[*]} " == *" server_request_fuzz "* ]]; then
  # Seeds: a real request of every endpoint (tests/server/fuzz/corpus/); new inputs go to request-corpus.
  # Threads get 1 MiB stacks (ulimit -s, in a subshell) so that recursion without a depth bound shows
  # as a stack overflow with inputs of a few KB, not only past 50 KB.
  mkdir -p build-fuzz/request-corpus build-fuzz/request-artifacts
  (ulimit -s 1024 && exec build-fuzz/tests/server/server_request_fuzz -max_total_time="$SECONDS_TO_RUN" -max_len=65536 -timeout=20 \
    -dict=tests/server/fuzz/request.dict -artifact_prefix=build-fuzz/request-artifacts/ \
    build-fuzz/request-corpus tests/server/fuzz/corpus)
fi
if [[ " ${TARGETS[*]} " == *" template_fuzz "* ]]; then
  # Seeds: the chat templates of the real models. The default 8 MiB stack, as the server's threads have: the
  # engine's nesting bounds (128 levels parsed, 512 rendered) are sized for it, and a template nesting
  # without a bound still overflows it within -max_len.
  mkdir -p build-fuzz/template-corpus build-fuzz/template-artifacts build-fuzz/template-seeds
  python3 - build-fuzz/template-seeds <<'PY' || true
import glob, json, os, sys
out = sys.argv[1]
sources = sorted(glob.glob('.npm-pkgs/tokenizer-*/package/models/tokenizer_config.json'))
for i, path in enumerate(sources):
    t = json.load(open(path)).get('chat_template')
    if isinstance(t, str):
        open(os.path.join(out, f'config_{i}.jinja'), 'w').write(t)
for path in glob.glob('tests/fixtures/chat/*/chat_template.jinja'):
    open(os.path.join(out, os.path.basename(os.path.dirname(path)) + '.jinja'), 'w').write(open(path).read())
PY
  (exec build-fuzz/tests/tokenizer/template_fuzz -max_total_time="$SECONDS_TO_RUN" -max_len=16384 \
    -timeout=20 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/template-artifacts/ build-fuzz/template-corpus \
    build-fuzz/template-seeds)
fi
if [[ " ${TARGETS[*]} " == *" model_files_fuzz "* ]]; then
  # Seeds: the configs and tokenizer files of the repository's models and fixtures (small ones).
  mkdir -p build-fuzz/files-corpus build-fuzz/files-artifacts build-fuzz/files-seeds
  for f in configs/*/config.json tests/fixtures/models/*/config.json tests/fixtures/models/*/generation_config.json \
           tests/fixtures/models/*/tokenizer_config.json; do
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -le 65536 ] && cp "$f" "build-fuzz/files-seeds/$(echo "$f" | tr / _)"
  done
  (ulimit -s 1024 && exec build-fuzz/tests/loader/model_files_fuzz -max_total_time="$SECONDS_TO_RUN" -max_len=65536 \
    -timeout=20 -rss_limit_mb=2048 -artifact_prefix=build-fuzz/files-artifacts/ build-fuzz/files-corpus \
    build-fuzz/files-seeds)
fi
[[ " ${TARGETS[*]} " == *" dist_wire_fuzz "* ]] || exit 0
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
exec build-fuzz/tests/distributed/dist_wire_fuzz -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -timeout=10 \
  -artifact_prefix=build-fuzz/fuzz-artifacts/ build-fuzz/fuzz-corpus
