#!/usr/bin/env bash
# Agent-style multi-turn time to first token on one GPU (H100 or H200): `tessera serve` on a real-size hybrid model
# with dummy weights and the real Qwen3 vocabulary, then `tessera bench --dataset-name agent` in the acceptance
# shape: 8 concurrent conversations, a shared 20,000-token system prompt, 10 turns of 200 new tokens in and 300 out,
# and a 500-token reference prompt sent alone (median of 3). Verdict: the mean TTFT of turns 2-10 divided by the
# reference TTFT, against 1.5. Then, if the deadline leaves room, the same with --no-enable-prefix-caching for
# contrast.
# Needs the bundle carried (scripts/bundle.sh --build-dir build/cuda --out /tmp/bundle; then
#   tar -cf - -C /tmp bundle | xz -T2 > bundle/bundle.tar.xz), carry ["bundle"], command:
#   bash scripts/device_agent_bench.sh
# MODEL (default configs/qwen3.5-35b-a3b). QUANT: auto (the default: --quantization fp8 on a GPU under 100 GB, where
# the bf16 weights leave too little room, else bf16), fp8 or bf16. DEADLINE (seconds, default 560): every command's
# timeout ends by it, and the contrast run starts only with CONTRAST_MIN (default 300) seconds left. CONVERSATIONS,
# TURNS, SYSTEM_LEN, TURN_IN, TURN_OUT, REFERENCE_LEN override the shape (MAX_LEN the server's --max-model-len). Writes to $OUT: summary.txt (the verdict
# line last), serve.log, agent.log, agent.json, and serve_off.log, agent_off.log, agent_off.json for the contrast.
# With dummy weights the answers are random tokens whose text may tokenize differently when sent back, so a turn's
# cache hit can end inside the previous answer; agent.log's per-turn cached-token column shows where hits end.
set -u
DEADLINE=${DEADLINE:-560}
left() { echo $((DEADLINE - SECONDS)); }
# t SECONDS: a timeout that ends by the deadline.
t() { local l=$(($(left) - 5)); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 1 ? l : 1)); }
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
S="$OUT/summary.txt"
: >"$S"
say() { echo "$*" | tee -a "$S"; }
[ -d /tmp/bundle ] || timeout "$(t 120)" tar -xJf bundle/bundle.tar.xz -C /tmp
T=/tmp/bundle/tessera
M=${MODEL:-configs/qwen3.5-35b-a3b}
TOK=.npm-pkgs/tokenizer-qwen3/package/models
PORT=8125
CONVERSATIONS=${CONVERSATIONS:-8} TURNS=${TURNS:-10} SYSTEM_LEN=${SYSTEM_LEN:-20000}
TURN_IN=${TURN_IN:-200} TURN_OUT=${TURN_OUT:-300} REFERENCE_LEN=${REFERENCE_LEN:-500}
[ -x "$T" ] || { say "no $T: carry the bundle (see the header of this script)"; exit 1; }
[ -f "$TOK/tokenizer.json" ] || { say "no $TOK/tokenizer.json: run scripts/fetch_test_data.sh before bundling"; exit 1; }

GPU=$(timeout 20 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits | head -1)
MIB=$(echo "$GPU" | awk -F', ' '{print $2}')
QUANT=${QUANT:-auto}
[ "$QUANT" = auto ] && { [ "${MIB:-0}" -lt 100000 ] && QUANT=fp8 || QUANT=bf16; }
QFLAG=()
[ "$QUANT" = fp8 ] && QFLAG=(--quantization fp8)
say "== $(date -u +%F) $GPU MiB; $("$T" --version | head -1); $M ($QUANT, dummy weights)"
# The last turn's prompt: system + turns x input + (turns - 1) x output, plus the chat template's tokens.
MAX_LEN=${MAX_LEN:-$((SYSTEM_LEN + TURNS * TURN_IN + TURNS * TURN_OUT + 4096))}

# serve TAG [FLAGS...]: starts the server (its log $OUT/serve$TAG.log) and waits for /health; PID in SERVER.
serve() {
  local tag=$1
  shift
  timeout "$(t 600)" "$T" serve "$M" --tokenizer "$TOK" --load-format dummy ${QFLAG[@]+"${QFLAG[@]}"} --port $PORT \
    --max-model-len $MAX_LEN --max-num-seqs 64 --served-model-name m "$@" >"$OUT/serve$tag.log" 2>&1 &
  SERVER=$!
  while [ "$(left)" -gt 10 ]; do
    timeout 5 curl -sf -o /dev/null http://127.0.0.1:$PORT/health && return 0
    kill -0 $SERVER 2>/dev/null || break
    sleep 2
  done
  say "serve$tag did not come up: $(tail -5 "$OUT/serve$tag.log" | tr '\n' ' ')"
  return 1
}
stop() {
  kill -TERM "$SERVER" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "$SERVER" 2>/dev/null || break; sleep 1; done
  kill -9 "$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
}
# bench TAG: the agent shape against the running server.
bench() {
  timeout "$(t 900)" "$T" bench --base-url http://127.0.0.1:$PORT --model m --dataset-name agent \
    --agent-conversations "$CONVERSATIONS" --agent-turns "$TURNS" --agent-system-prompt-len "$SYSTEM_LEN" \
    --agent-turn-input-len "$TURN_IN" --agent-turn-output-len "$TURN_OUT" --agent-reference-len "$REFERENCE_LEN" \
    --agent-reference-runs 3 --tokenizer "$TOK" --temperature 0 --no-progress --json "$OUT/agent$1.json" \
    >"$OUT/agent$1.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || say "bench$1 exited $rc (124: the deadline): $(tail -3 "$OUT/agent$1.log" | tr '\n' ' ')"
  grep -A$((TURNS + 3)) "^agent conversations" "$OUT/agent$1.log" | tee -a "$S"
}
# verdict FILE LABEL: one line from the JSON report.
verdict() {
  timeout 20 python3 - "$1" "$2" "$TURNS" <<'PY' | tee -a "$S"
import json, sys
try:
    a = json.load(open(sys.argv[1]))["agent"]
except Exception as e:
    print(f"{sys.argv[2]}: no report ({e})"); sys.exit(0)
later, ref = a["later_turns"], a["reference"]
ratio, hit = later["ttft_ratio_to_reference"], later["prefix_cache_hit_rate"]
if ratio is None:
    print(f"{sys.argv[2]}: no ratio (reference {ref['completed']} ok, turns 2-{sys.argv[3]} mean TTFT "
          f"{later['mean_ttft_ms']})"); sys.exit(0)
word = "PASS" if ratio <= 1.5 else "FAIL"
print(f"{sys.argv[2]}: {word}: mean TTFT of turns 2-{sys.argv[3]} {later['mean_ttft_ms']:.1f} ms = {ratio:.2f}x the "
      f"{ref['prompt_len']}-token reference ({ref['ttft_ms']['median']:.1f} ms), limit 1.5; prefix-cache hit rate "
      f"{'n/a' if hit is None else f'{100 * hit:.1f}%'}")
PY
}

if serve ""; then
  bench ""
  stop
fi
if [ "${CONTRAST:-1}" = 1 ] && [ "$(left)" -gt "${CONTRAST_MIN:-300}" ]; then
  if serve _off --no-enable-prefix-caching; then
    bench _off
    stop
  fi
  verdict "$OUT/agent_off.json" "prefix caching off (contrast)"
else
  say "contrast run with prefix caching off skipped: $(left) s left (CONTRAST_MIN ${CONTRAST_MIN:-300})"
fi
verdict "$OUT/agent.json" "verdict"
