#!/usr/bin/env bash
# A Hugging Face id (`org/name`, as the seeds' `vllm serve Qwen/...` commands give it) resolves to its snapshot in
# the hub cache: a cache laid out as huggingface_hub does (refs/main -> snapshots/<commit>) holding the demo model;
# `tessera serve tessera/demo` serves it under that name, --revision picks another snapshot, and a missing id fails
# at once naming where it looked and how to download.
#   hf_cache_serve.sh TESSERA_BIN
set -euo pipefail
BIN="$1"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(mktemp -d /tmp/tessera-hf-cache.XXXXXX)"
PID=""
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
REPO="$WORK/hub/models--tessera--demo"
for commit in c0ffee beef01; do
  mkdir -p "$REPO/snapshots/$commit"
  for f in "$ROOT"/models/tessera-demo/*; do ln -s "$f" "$REPO/snapshots/$commit/"; done
done
mkdir -p "$REPO/refs" && echo c0ffee > "$REPO/refs/main" && echo beef01 > "$REPO/refs/v2"

HF_HUB_CACHE="$WORK/hub" "$BIN" serve tessera/demo --device cpu --host 127.0.0.1 --port 0 --revision v2 \
  --max-model-len 512 > "$WORK/log" 2>&1 &
PID=$!
PORT=""
for _ in $(seq 1 600); do
  PORT="$(sed -n 's/.*Starting tessera API server on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$WORK/log" | head -1)"
  [ -n "$PORT" ] && break
  kill -0 "$PID" 2>/dev/null || { cat "$WORK/log"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "server did not start"; cat "$WORK/log"; exit 1; }
MODELS="$(curl -sf "http://127.0.0.1:$PORT/v1/models")"
echo "$MODELS" | grep -q '"id":"tessera/demo"' || { echo "not served as tessera/demo: $MODELS"; exit 1; }
echo "$MODELS" | grep -q 'snapshots/beef01' || { echo "--revision v2 not used: $MODELS"; exit 1; }
kill -TERM "$PID"; wait "$PID"; PID=""

if HF_HUB_CACHE="$WORK/hub" "$BIN" serve other/model --device cpu > "$WORK/err" 2>&1; then
  echo "a missing id started"; exit 1
fi
grep -q "models--other--model" "$WORK/err" && grep -q "hf download other/model" "$WORK/err" ||
  { echo "the error does not say where it looked and how to download:"; cat "$WORK/err"; exit 1; }
echo "hf_cache_serve: ok"
