#!/usr/bin/env bash
# `tessera plan` and `tessera serve` agree on the seeds' command lines: each line is planned for this
# machine (CPU ranks) and served with the same flags.
#   - plan says it fits (exit 0): serve starts, answers /health and a completion;
#   - plan says it does not fit: serve exits non-zero before loading anything, with the plan's verdict;
#   - plan refuses the flags (an error): serve refuses them with the same message.
# The lines: seed 000's production command (the flagship config, TP 8, MTP with 2 speculative
# tokens; `--distributed-executor-backend ray` left out, since serve would wait for a `tessera node`
# cluster: tests/integration/netns_cluster_test.sh runs that flow), seed 003's (TP 2), and the demo
# model (it ships an MTP layer) with seed 000's --speculative-config at TP 2, PP 2 and TP 4 (its
# Gated DeltaNet has 2 key heads: refused).
#   plan_serve_agree.sh TESSERA_BIN
set -uo pipefail
BIN=${1:?usage: plan_serve_agree.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
TMP="$(mktemp -d /tmp/tessera-plan-serve.XXXXXX)"
PID=""
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

SPEC='{"method":"mtp","num_speculative_tokens":2}'
FLAGSHIP="$ROOT/configs/qwen3.5-122b-a10b-fp8"
# The flagship's folder holds its config only: serve takes the Qwen3 tokenizer the test data provides.
TOK="$ROOT/.npm-pkgs/tokenizer-qwen3/package/models"
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: no $TOK/tokenizer.json (scripts/fetch_test_data.sh)"; exit 77; }
DEMO="$ROOT/models/tessera-demo"

# check NAME MODEL [flags...]
check() {
  local name="$1" model="$2"; shift 2
  echo "== $name: $*"
  "$BIN" plan "$model" --device cpu "$@" >"$TMP/plan.out" 2>"$TMP/plan.err"
  local prc=$?
  "$BIN" serve "$model" --device cpu --host 127.0.0.1 --port 0 --disable-uvicorn-access-log "$@" \
    >"$TMP/serve.log" 2>&1 &
  PID=$!
  local port="" done=0
  for _ in $(seq 1 3000); do  # up to 300 s: rank processes, the weights, the MTP calibration
    port="$(sed -n 's/.*Starting tessera API server on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$TMP/serve.log" | head -1)"
    [ -n "$port" ] && break
    kill -0 "$PID" 2>/dev/null || { done=1; break; }
    sleep 0.1
  done
  local src=0
  if [ $done = 1 ]; then wait "$PID"; src=$?; PID=""; fi
  if [ $prc = 0 ]; then
    echo "plan: fits"
    if [ -z "$port" ] && [ ! -e "$model/model.safetensors.index.json" ] && [ ! -e "$model/model.safetensors" ] &&
      grep -q "no model.safetensors, model.safetensors.index.json or \*.safetensors file" "$TMP/serve.log" &&
      ! grep -q "not built yet" "$TMP/serve.log"; then
      # A config-only folder (the flagship's): serve took the layout and stopped at the weights.
      echo "serve: took the layout, stopped at the missing weights (a config-only folder)"
      return
    fi
    if [ -z "$port" ]; then
      fail "$name: plan says it fits, serve did not start (exit $src)"; tail -20 "$TMP/serve.log"; return
    fi
    local url="http://127.0.0.1:$port" ok=0
    for _ in $(seq 1 100); do curl -sf -o /dev/null "$url/health" && { ok=1; break; }; sleep 0.1; done
    [ $ok = 1 ] || fail "$name: /health does not answer 200"
    curl -sS -H 'Content-Type: application/json' "$url/v1/completions" \
      -d '{"prompt":"Once upon a time","max_tokens":12,"temperature":0,"ignore_eos":true}' >"$TMP/c.json" ||
      fail "$name: completion request"
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["usage"]["completion_tokens"]==12, r' \
      "$TMP/c.json" || fail "$name: bad completion: $(cat "$TMP/c.json")"
    grep -q "Speculative decoding: mtp (num_speculative_tokens=2" "$TMP/serve.log" || fail "$name: no MTP line"
    kill -TERM "$PID"; wait "$PID"; PID=""
    echo "serve: started and answered"
    return
  fi
  [ -n "$port" ] && { fail "$name: plan exit $prc, but serve started"; cat "$TMP/plan.out" "$TMP/plan.err"; return; }
  [ $src != 0 ] || fail "$name: plan exit $prc, serve exit 0"
  grep -q -- "not built yet" "$TMP/serve.log" && fail "$name: serve refuses what plan planned"
  # The plan's verdict (does not fit) or its error, as serve gives it. Numbers are masked: on CPU the
  # plan counts the memory free at that moment, which other processes change between the two runs.
  local want
  want="$(python3 - "$TMP/plan.out" "$TMP/plan.err" <<'PY'
import re, sys
out, err = open(sys.argv[1]).read(), open(sys.argv[2]).read()
m = re.search(r"(does not fit: [^\n]*)", out) or re.search(r"error: ([^\n]*)", err)
print(m.group(1)[:100] if m else "")
PY
)"
  echo "plan: exit $prc: $want"
  [ -n "$want" ] || { fail "$name: plan exit $prc without a verdict or an error"; cat "$TMP/plan.out" "$TMP/plan.err"; return; }
  python3 - "$want" "$TMP/serve.log" <<'PY' || { fail "$name: serve does not say '$want'"; tail -5 "$TMP/serve.log"; return; }
import re, sys
mask = lambda t: re.sub(r"[0-9][0-9.,]*", "#", t)
sys.exit(0 if mask(sys.argv[1]) in mask(open(sys.argv[2]).read()) else 1)
PY
  if grep -qE "Initialising dummy weights|Loading safetensors|Loading weights took" "$TMP/serve.log"; then
    fail "$name: serve touched weights before refusing"
  fi
  echo "serve: exit $src, the same words"
}

check "seed 000" "$FLAGSHIP" --tokenizer "$TOK" --tensor-parallel-size 8 --max-model-len 262144 --max-num-seqs 8 \
  --gpu-memory-utilization 0.85 --kv-cache-dtype fp8 --served-model-name Qwen3.5-122B-A10B-FP8 --trust-remote-code \
  --language-model-only --speculative-config "$SPEC"
check "seed 003" "$FLAGSHIP" --tokenizer "$TOK" --tensor-parallel-size 2 --max-model-len 2048 --gpu-memory-utilization 0.60 \
  --enforce-eager --disable-custom-all-reduce --trust-remote-code --language-model-only --reasoning-parser qwen3
check "demo TP 2" "$DEMO" --tensor-parallel-size 2 --max-model-len 1024 --speculative-config "$SPEC"
check "demo PP 2" "$DEMO" --pipeline-parallel-size 2 --max-model-len 1024 --speculative-config "$SPEC"
check "demo TP 4" "$DEMO" --tensor-parallel-size 4 --max-model-len 1024 --speculative-config "$SPEC"
[ $failed = 0 ] && echo "PASS: plan and serve agree"
exit $failed
