#!/usr/bin/env bash
# curl against the real `tessera serve` (tiny dummy Qwen3): raw SSE framing and headers, auth,
# overload (429 + Retry-After past --max-waiting-requests), and SIGTERM drain of a live stream.
#   server_curl.sh TESSERA_BIN            runs every part, each on its own server
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "FAIL: $*"; exit 1; }
ends_done() { [ "$(tail -c 14 "$1" | base64)" = "$(printf 'data: [DONE]\n\n' | base64)" ]; }
AUTH=(-H "Authorization: Bearer ${TESSERA_API_KEY:-}" -H "Content-Type: application/json")

basic() {
  AUTH=(-H "Authorization: Bearer $TESSERA_API_KEY" -H "Content-Type: application/json")
  # Streaming: raw bytes exactly as OpenAI frames them.
  curl -sS -N -D "$TMP/h" "${AUTH[@]}" "$TESSERA_URL/v1/chat/completions" \
    -d '{"model":"qwen3-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' >"$TMP/s" || fail "stream request"
  grep -qi '^content-type: text/event-stream' "$TMP/h" || fail "content-type"
  grep -qi '^x-accel-buffering: no' "$TMP/h" || fail "X-Accel-Buffering"
  grep -qi '^cache-control: no-cache' "$TMP/h" || fail "Cache-Control"
  ends_done "$TMP/s" || fail "stream does not end with data: [DONE]"
  head -1 "$TMP/s" | grep -q '^data: {.*"delta":{"role":"assistant","content":""}' || fail "first delta has no role"
  n="$(grep -c '^data: ' "$TMP/s")"; [ "$n" -ge 4 ] || fail "only $n events"
  [ "$(grep -vc '^data: \|^$' "$TMP/s")" = 0 ] || fail "lines other than data: events"
  grep -q '"usage":{"prompt_tokens":[0-9]*,"total_tokens":[0-9]*,"completion_tokens":5' "$TMP/s" || fail "usage chunk"
  # Anthropic streaming events.
  curl -sS -N -H "x-api-key: $TESSERA_API_KEY" -H 'content-type: application/json' "$TESSERA_URL/v1/messages" \
    -d '{"model":"qwen3-tiny","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}' >"$TMP/a"
  [ "$(grep '^event: ' "$TMP/a" | head -2 | tr '\n' ' ')" = "event: message_start event: content_block_start " ] || fail "anthropic event order"
  [ "$(grep '^event: ' "$TMP/a" | tail -1)" = "event: message_stop" ] || fail "anthropic last event"
  # Auth and open endpoints.
  [ "$(curl -s -o "$TMP/e" -w '%{http_code}' "$TESSERA_URL/v1/models")" = 401 ] || fail "401 without key"
  grep -q '"error":{"message"' "$TMP/e" || fail "401 body"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$TESSERA_URL/health")" = 200 ] || fail "/health"
  curl -s "$TESSERA_URL/version" >"$TMP/v"; grep -q '"version"' "$TMP/v" || fail "/version"
  curl -s "$TESSERA_URL/metrics" >"$TMP/m"; grep -q '^vllm:num_requests_running' "$TMP/m" || fail "/metrics"
  # A 10 MB body sent by curl (Expect: 100-continue) gets 413 before it is uploaded.
  head -c 11000000 /dev/zero | tr '\0' 'a' >"$TMP/big"
  [ "$(curl -s -o "$TMP/e" -w '%{http_code}' "${AUTH[@]}" --data-binary @"$TMP/big" "$TESSERA_URL/v1/chat/completions")" = 413 ] || fail "413"
  grep -q 'larger than the server allows' "$TMP/e" || fail "413 body"
  echo "basic: ok"
}

overload() {
  AUTH=(-H "Authorization: Bearer $TESSERA_API_KEY" -H "Content-Type: application/json")
  long='{"model":"qwen3-tiny","prompt":"x","max_tokens":4000,"ignore_eos":true}'
  curl -s -o /dev/null "${AUTH[@]}" "$TESSERA_URL/v1/completions" -d "$long" & p1=$!
  sleep 0.5
  curl -s -o /dev/null "${AUTH[@]}" "$TESSERA_URL/v1/completions" -d "$long" & p2=$!
  sleep 0.5
  code="$(curl -s -D "$TMP/h" -o "$TMP/e" -w '%{http_code}' "${AUTH[@]}" "$TESSERA_URL/v1/completions" -d "$long")"
  [ "$code" = 429 ] || fail "expected 429, got $code: $(cat "$TMP/e")"
  grep -qi '^retry-after: ' "$TMP/h" || fail "no Retry-After"
  grep -q 'max-waiting-requests' "$TMP/e" || fail "429 body"
  # SIGTERM now: the two in-flight requests are aborted after --drain-timeout and answered; exit 0.
  kill -TERM "$TESSERA_PID"
  wait "$p1" "$p2"
  echo "overload: ok"
}

drain() {
  # A live stream during SIGTERM ends with a finish_reason and [DONE]. Until it is done the listener stays
  # open: /health answers 503 and a new generation request 503 (before, the listener closed first and
  # load balancers saw refused connections instead).
  curl -sS -N -H "Authorization: Bearer $TESSERA_API_KEY" -H 'content-type: application/json' \
    "$TESSERA_URL/v1/chat/completions" \
    -d '{"model":"qwen3-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4000,"ignore_eos":true,"stream":true}' >"$TMP/d" & p=$!
  sleep 1
  kill -TERM "$TESSERA_PID"
  sleep 0.2
  code="$(curl -s -o /dev/null -w '%{http_code}' "$TESSERA_URL/health")"
  [ "$code" = 503 ] || fail "/health during the drain: expected 503, got $code"
  code="$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TESSERA_API_KEY" -H 'content-type: application/json' \
    "$TESSERA_URL/v1/completions" -d '{"model":"qwen3-tiny","prompt":"x","max_tokens":2}')"
  [ "$code" = 503 ] || fail "a new request during the drain: expected 503, got $code"
  wait "$p" || fail "stream broke during drain"
  ends_done "$TMP/d" || fail "drained stream does not end with [DONE]"
  grep -q '"finish_reason":"\(abort\|length\)"' "$TMP/d" || fail "no finish_reason in the drained stream"
  echo "drain: ok"
}

case "${1:-}" in
  --part)
    TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
    "$2" ;;
  *)
    BIN="$1"
    "$HERE/server_run.sh" "$BIN" -- -- "$0" --part basic || exit 1
    "$HERE/server_run.sh" "$BIN" -- --max-num-seqs 1 --max-waiting-requests 1 --drain-timeout 1 -- "$0" --part overload || exit 1
    "$HERE/server_run.sh" "$BIN" -- --drain-timeout 1 -- "$0" --part drain || exit 1
    ;;
esac
