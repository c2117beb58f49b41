#!/usr/bin/env bash
# vLLM's frontend flags on the real `tessera serve` (tiny dummy Qwen3, real tokenizer):
#   - HTTPS with a self-signed certificate made here by `openssl req`: curl and node (the openai npm client and
#     node's own https module) trust it as their CA; plain HTTP to the port gets no answer; a missing key file
#     is one "error: ..." line naming it, exit 2;
#   - CORS: preflights (no key needed) and simple requests, --allowed-origins' list and the ["*"] default;
#   - --max-logprobs 5 refusing top_logprobs 6 with vLLM's words, and -1 allowing more than 20.
#   server_https.sh TESSERA_BIN
set -uo pipefail
BIN=${1:?usage: server_https.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOK="$ROOT/.npm-pkgs/tokenizer-qwen3/package/models"
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: $TOK/tokenizer.json missing (run scripts/fetch_test_data.sh)"; exit 77; }
command -v openssl >/dev/null || { echo "SKIP: no openssl command (Debian's openssl package)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
TMP="$(mktemp -d /tmp/tessera-https-test.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
KEY=test-key-123
JSON=(-H "Authorization: Bearer $KEY" -H "Content-Type: application/json")

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=localhost \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>"$TMP/openssl.log" ||
  fail "openssl req: $(cat "$TMP/openssl.log")"

# start NAME FLAGS...: a server on a free port; sets URL to its base URL (the scheme its startup line names).
start() {
  local name=$1; shift
  "$BIN" serve "$ROOT/configs/qwen3-tiny" --tokenizer "$TOK" --load-format dummy --device cpu --host 127.0.0.1 \
    --port 0 --served-model-name qwen3-tiny --max-model-len 4096 --num-gpu-blocks-override 4096 --api-key "$KEY" \
    --disable-uvicorn-access-log "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  URL=""
  for _ in $(seq 1 600); do
    URL="$(sed -n 's/.*Starting tessera API server on \(https\{0,1\}\):\/\/[^:]*:\([0-9]*\).*/\1:\/\/127.0.0.1:\2/p' "$TMP/$name.log" | head -1)"
    [ -n "$URL" ] && break
    kill -0 "${PIDS[-1]}" 2>/dev/null || fail "$name exited during startup: $(cat "$TMP/$name.log")"
    sleep 0.1
  done
  [ -n "$URL" ] || fail "$name did not start: $(cat "$TMP/$name.log")"
}
# stop: SIGTERM the last server started; it must drain and exit 0.
stop() {
  local pid=${PIDS[-1]}
  kill -TERM "$pid"
  wait "$pid" || fail "server did not exit 0 after SIGTERM"
  unset 'PIDS[-1]'
}
chat() {  # chat TOP_LOGPROBS: a chat request asking for that many top logprobs per token
  printf '{"model":"qwen3-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"logprobs":true,"top_logprobs":%s}' "$1"
}
count_top() {  # the number of top_logprobs of the first token of a chat answer
  python3 -c 'import json,sys; print(len(json.load(sys.stdin)["choices"][0]["logprobs"]["content"][0]["top_logprobs"]))'
}

# ---- a bad key file: one error line naming it, before anything loads -----------------------------------
"$BIN" serve "$ROOT/configs/qwen3-tiny" --ssl-certfile "$TMP/cert.pem" --ssl-keyfile "$TMP/none.pem" >"$TMP/bad" 2>&1
rc=$?
[ $rc = 2 ] || fail "a missing --ssl-keyfile: exit $rc, want 2: $(cat "$TMP/bad")"
grep -q "^error: --ssl-keyfile $TMP/none.pem: cannot read the file" "$TMP/bad" || fail "bad key error: $(cat "$TMP/bad")"

# ---- HTTPS, --max-logprobs 5, CORS for one origin ---------------------------------------------------
start tls --ssl-certfile "$TMP/cert.pem" --ssl-keyfile "$TMP/key.pem" --max-logprobs 5 \
  --allowed-origins '["https://app.example"]'
case "$URL" in https://*) ;; *) fail "the startup line does not name https: $URL" ;; esac
C=(curl -sS --cacert "$TMP/cert.pem")
[ "$("${C[@]}" -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] || fail "/health over HTTPS"
curl -s -o /dev/null "$URL/health" && fail "curl trusted the self-signed certificate without --cacert"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://${URL#https://}/health")
[ "$code" = 200 ] && fail "plain HTTP was answered on the HTTPS port"
"${C[@]}" -o "$TMP/r" -w '%{http_code}\n' "${JSON[@]}" "$URL/v1/chat/completions" -d "$(chat 6)" >"$TMP/code"
[ "$(cat "$TMP/code")" = 400 ] || fail "top_logprobs 6 with --max-logprobs 5: $(cat "$TMP/code") $(cat "$TMP/r")"
grep -q '"message":"Requested sample logprobs of 6, which is greater than max allowed: 5"' "$TMP/r" ||
  fail "the 400's message: $(cat "$TMP/r")"
[ "$("${C[@]}" "${JSON[@]}" "$URL/v1/chat/completions" -d "$(chat 5)" | count_top)" = 5 ] || fail "top_logprobs 5"
# A stream over TLS ends with [DONE].
"${C[@]}" -N "${JSON[@]}" "$URL/v1/chat/completions" \
  -d '{"model":"qwen3-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}' >"$TMP/s"
[ "$(tail -c 14 "$TMP/s" | base64)" = "$(printf 'data: [DONE]\n\n' | base64)" ] || fail "stream over HTTPS: $(cat "$TMP/s")"
# Node: the openai npm client (the certificate as an extra CA) and the https module (the certificate as ca).
if command -v node >/dev/null && [ -d "$ROOT/tests/node/node_modules/openai" ]; then
  (cd "$ROOT/tests/node" && NODE_EXTRA_CA_CERTS="$TMP/cert.pem" node --input-type=module -e "
    import OpenAI from 'openai';
    const client = new OpenAI({ baseURL: '$URL/v1', apiKey: '$KEY' });
    const r = await client.chat.completions.create({ model: 'qwen3-tiny', max_tokens: 2,
      messages: [{ role: 'user', content: 'hi' }] });
    if (r.choices.length !== 1) throw new Error('no choice');
    const https = await import('node:https');
    const fs = await import('node:fs');
    const status = await new Promise((ok, bad) => https.get('$URL/v1/models',
      { ca: fs.readFileSync('$TMP/cert.pem'), headers: { Authorization: 'Bearer $KEY' } },
      (res) => { res.resume(); ok(res.statusCode); }).on('error', bad));
    if (status !== 200) throw new Error('https.get: ' + status);
  ") || fail "node clients over HTTPS"
else
  echo "note: node or the openai npm client missing; node part skipped"
fi
# CORS preflight: no key, the origin echoed (a listed origin), requested headers mirrored (the ["*"] default).
"${C[@]}" -D "$TMP/h" -o "$TMP/b" -X OPTIONS "$URL/v1/chat/completions" -H 'Origin: https://app.example' \
  -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization,content-type'
head -1 "$TMP/h" | grep -q ' 200' || fail "preflight: $(cat "$TMP/h" "$TMP/b")"
[ "$(cat "$TMP/b")" = OK ] || fail "preflight body: $(cat "$TMP/b")"
for want in 'access-control-allow-origin: https://app.example' 'vary: Origin' 'access-control-max-age: 600' \
  'access-control-allow-methods: DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT' \
  'access-control-allow-headers: authorization,content-type'; do
  tr -d '\r' <"$TMP/h" | grep -qix "$want" || fail "preflight lacks '$want': $(cat "$TMP/h")"
done
code=$("${C[@]}" -o "$TMP/b" -w '%{http_code}' -X OPTIONS "$URL/v1/models" -H 'Origin: https://evil.example' \
  -H 'Access-Control-Request-Method: GET')
[ "$code" = 400 ] && [ "$(cat "$TMP/b")" = "Disallowed CORS origin" ] || fail "disallowed origin: $code $(cat "$TMP/b")"
"${C[@]}" -D "$TMP/h" -o /dev/null "${JSON[@]}" -H 'Origin: https://app.example' "$URL/v1/models"
tr -d '\r' <"$TMP/h" | grep -qix 'access-control-allow-origin: https://app.example' || fail "simple request: $(cat "$TMP/h")"
"${C[@]}" -D "$TMP/h" -o /dev/null -H 'Origin: https://evil.example' "$URL/v1/models"
grep -qi '^access-control-allow-origin' "$TMP/h" && fail "an unlisted origin got Access-Control-Allow-Origin"
stop
echo "https, --max-logprobs 5, CORS for one origin: ok"

# ---- plain HTTP, --max-logprobs -1, CORS defaults -----------------------------------------------------
start plain --max-logprobs -1
case "$URL" in http://*) ;; *) fail "the startup line does not name http: $URL" ;; esac
[ "$(curl -sS "${JSON[@]}" "$URL/v1/chat/completions" -d "$(chat 25)" | count_top)" = 25 ] ||
  fail "top_logprobs 25 with --max-logprobs -1"
curl -sS -D "$TMP/h" -o /dev/null -H 'Origin: https://anywhere.example' "$URL/health"
tr -d '\r' <"$TMP/h" | grep -qix 'access-control-allow-origin: \*' || fail "default CORS: $(cat "$TMP/h")"
curl -sS -D "$TMP/h" -o /dev/null "$URL/health"
grep -qi '^access-control-allow-origin' "$TMP/h" && fail "CORS headers without an Origin"
stop
echo "plain HTTP, --max-logprobs -1, CORS defaults: ok"
echo "PASS: server_https"
