#!/usr/bin/env bash
# Starts the real `tessera serve` on the tiny dummy Qwen3 (random weights, real tokenizer) on a
# free port, waits for /health, runs the given command with TESSERA_URL / TESSERA_PID /
# TESSERA_API_KEY / TESSERA_LOG set, then stops the server with SIGTERM and checks that it
# drained and exited 0 (and, under ASan, printed no sanitizer report).
#   server_run.sh TESSERA_BIN -- [extra serve flags] -- command...
set -uo pipefail
BIN="$1"; shift
[ "$1" = "--" ] && shift
EXTRA=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do EXTRA+=("$1"); shift; done
shift
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOK="${TESSERA_TEST_TOKENIZER:-$ROOT/.npm-pkgs/tokenizer-qwen3/package/models}"
if [ ! -f "$TOK/tokenizer.json" ]; then
  echo "SKIP: $TOK/tokenizer.json missing (run scripts/fetch_test_data.sh)"; exit 77
fi
if [ ! -d "$ROOT/tests/node/node_modules/openai" ] || [ ! -d "$ROOT/tests/node/node_modules/@anthropic-ai/sdk" ]; then
  echo "SKIP: the openai / @anthropic-ai/sdk npm clients are missing (run scripts/fetch_test_data.sh)"; exit 77
fi
WORK="$(mktemp -d /tmp/tessera-server-test.XXXXXX)"
LOG="$WORK/server.log"
: >"$LOG"
export TESSERA_API_KEY="${TESSERA_API_KEY:-test-key-123}"
# TESSERA_TEST_MODEL / TESSERA_TEST_MAX_MODEL_LEN / TESSERA_TEST_LOAD_FORMAT / TESSERA_TEST_TOKENIZER: another
# model directory, context, load format and tokenizer (tool_model_run.sh's hand-set weights, the agents' long
# context, the demo model with its own tokenizer);
# TESSERA_TEST_ACCESS_LOG=1 keeps the access log (one line per request with its status).
MODEL="${TESSERA_TEST_MODEL:-$ROOT/configs/qwen3-tiny}"
ACCESS=(--disable-uvicorn-access-log)
[ "${TESSERA_TEST_ACCESS_LOG:-0}" = 1 ] && ACCESS=()
"$BIN" serve "$MODEL" --tokenizer "$TOK" --load-format "${TESSERA_TEST_LOAD_FORMAT:-dummy}" --device cpu \
  --host 127.0.0.1 --port 0 --served-model-name qwen3-tiny --served-model-name tiny-alias \
  --max-model-len "${TESSERA_TEST_MAX_MODEL_LEN:-4096}" --num-gpu-blocks-override 4096 "${ACCESS[@]}" "${EXTRA[@]}" >"$LOG" 2>&1 &
PID=$!
cleanup() { kill -9 "$PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
PORT=""
for _ in $(seq 1 600); do  # up to 60 s
  PORT="$(sed -n 's/.*Starting tessera API server on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$LOG" | head -1)"
  [ -n "$PORT" ] && break
  kill -0 "$PID" 2>/dev/null || { echo "server exited during startup:"; cat "$LOG"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "server did not start:"; cat "$LOG"; exit 1; }
export TESSERA_URL="http://127.0.0.1:$PORT" TESSERA_PID="$PID" TESSERA_LOG="$LOG"
for _ in $(seq 1 100); do
  curl -sf -o /dev/null "$TESSERA_URL/health" && break
  sleep 0.1
done
"$@"
RC=$?
kill -TERM "$PID" 2>/dev/null  # the command may have sent it already
SRC=1
for _ in $(seq 1 400); do  # up to 40 s
  STATE="$(ps -o stat= -p "$PID" 2>/dev/null)"
  if [ -z "$STATE" ] || [ "${STATE#Z}" != "$STATE" ]; then wait "$PID"; SRC=$?; break; fi
  sleep 0.1
done
if [ "$SRC" != 0 ]; then echo "server did not exit 0 after SIGTERM (rc $SRC)"; tail -50 "$LOG"; RC=1; fi
if grep -q "ERROR: AddressSanitizer\|runtime error:\|ERROR: LeakSanitizer" "$LOG"; then
  echo "sanitizer report in the server log:"; grep -A30 "Sanitizer\|runtime error" "$LOG" | head -80; RC=1
fi
[ "$RC" = 0 ] || { echo "--- server log (tail) ---"; tail -30 "$LOG"; }
exit $RC
