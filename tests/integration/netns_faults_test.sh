#!/usr/bin/env bash
# Cluster faults across two network namespaces (hosts A 10.84.0.1 and B 10.84.0.2), `tessera serve`
# TP=2 of the demo model on CPU ranks, one rank per node (docs/distributed.md, "Rejoin" and "Timeouts"):
#   1. a second node with a --node-rank in use, from the holder's host and from another host: each is
#      refused and exits non-zero naming the rank and the node that holds it; the job keeps serving
#      (/health 200, a completion after the refusals, both nodes still run).
#   2. the node's supervisor process stopped (SIGSTOP; its rank keeps running) while a stream runs: the
#      stream ends with an error event naming node 1 (never finish_reason "abort"), /health answers
#      503 within 30 s, the head exits non-zero naming node 1; after SIGCONT the node exits non-zero
#      saying the head declared it dead.
#   3. the head killed (SIGKILL): the node exits non-zero saying the head is gone, never that a peer is
#      "still connected to the head".
#   netns_faults_test.sh TESSERA_BIN     (root; exit 77 = skipped)
set -uo pipefail
BIN="$(readlink -f "${1:?usage: netns_faults_test.sh TESSERA_BIN}")"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODEL="$ROOT/models/tessera-demo"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
# shellcheck source=netns_hosts.sh
source "$HERE/netns_hosts.sh"
TMP=$(mktemp -d /tmp/tessera-netns-faults.XXXXXX)
chmod 755 "$TMP"
netns_hosts_up tfl 10.84.0
# shellcheck source=launch_checks.sh
source "$HERE/launch_checks.sh"
lacks() { ! grep -q -- "$2" "$1" || { FAIL "$1 has '$2'"; grep -- "$2" "$1" | head -3; }; }
T_START=$(date +%s.%N)
export TESSERA_CLUSTER_TOKEN=netns-faults-token
SERVE=(serve "$MODEL" --device cpu --tensor-parallel-size 2 --max-model-len 4096 --host 127.0.0.1 --port 8000
       --disable-uvicorn-access-log --nnodes 2 --master-addr 10.84.0.1 --join-timeout 60)
URL=http://127.0.0.1:8000
health() { ip netns exec "$A" curl -s -o /dev/null -m 2 -w '%{http_code}' "$URL/health"; }
complete() {  # complete OUT: a 12-token greedy completion on the head
  ip netns exec "$A" curl -sS -m 60 -H 'Content-Type: application/json' "$URL/v1/completions" \
    -d "{\"prompt\":[$PROMPT],\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}" >"$1" 2>&1
  python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["choices"][0]["text"]; assert t, t' "$1" 2>/dev/null
}
wait_pid() {  # wait_pid PID SECONDS: sets RC once PID exited, returns 1 if it still runs
  for _ in $(seq 1 $(($2 * 10))); do
    if ! kill -0 "$1" 2>/dev/null; then wait "$1"; RC=$?; return 0; fi
    sleep 0.1
  done
  return 1
}
# start_pair TAG PORT: head in A (HEAD), node 1 in B (NODE); returns 1 unless the head serves within 90 s.
start_pair() {
  ip netns exec "$A" "$BIN" "${SERVE[@]}" --master-port "$2" --node-rank 0 >"$TMP/$1.head.log" 2>&1 &
  HEAD=$!; PIDS+=($HEAD)
  ip netns exec "$B" "$BIN" "${SERVE[@]}" --master-port "$2" --node-rank 1 >"$TMP/$1.node.log" 2>&1 &
  NODE=$!; PIDS+=($NODE)
  for _ in $(seq 1 900); do
    grep -q "Application startup complete" "$TMP/$1.head.log" && return 0
    kill -0 "$HEAD" 2>/dev/null || break
    sleep 0.1
  done
  FAIL "$1: the head did not serve within 90 s"; tail -n 20 "$TMP/$1.head.log" "$TMP/$1.node.log"
  return 1
}

# --- 1. a second node rank 1 while the job runs
if start_pair dup 29610; then
  T0=$(date +%s.%N)
  # From the holder's host (B), then from another host (A; --nic: A's route to the master is local).
  ip netns exec "$B" timeout 60 "$BIN" "${SERVE[@]}" --master-port 29610 --node-rank 1 >"$TMP/dup.same.log" 2>&1
  SAME_RC=$?
  ip netns exec "$A" timeout 60 "$BIN" "${SERVE[@]}" --master-port 29610 --node-rank 1 --nic =ens1 \
    >"$TMP/dup.other.log" 2>&1
  OTHER_RC=$?
  T1=$(date +%s.%N)
  [ "$SAME_RC" != 0 ] && [ "$SAME_RC" != 124 ] || FAIL "a second node rank 1 on the holder's host exited $SAME_RC"
  [ "$OTHER_RC" != 0 ] && [ "$OTHER_RC" != 124 ] || FAIL "a second node rank 1 on another host exited $OTHER_RC"
  for f in "$TMP/dup.same.log" "$TMP/dup.other.log"; do
    has "$f" "error: .*node rank 1 is held by node 1 (host .*, 10.84.0.2), which is alive"
  done
  has "$TMP/dup.other.log" "refused host .* (10.84.0.1)"
  has "$TMP/dup.head.log" "refused 10.84.0.2:.*node rank 1 is held by node 1"
  lacks "$TMP/dup.head.log" "closed by the node"
  kill -0 "$NODE" 2>/dev/null || FAIL "the node holding rank 1 ended after the refused joins: $(tail -n 3 "$TMP/dup.node.log")"
  kill -0 "$HEAD" 2>/dev/null || FAIL "the head ended after the refused joins: $(tail -n 3 "$TMP/dup.head.log")"
  [ "$(health)" = 200 ] || FAIL "/health is not 200 after the refused joins"
  complete "$TMP/dup.after.json" || FAIL "no completion after the refused joins: $(head -c 300 "$TMP/dup.after.json")"
  grep -h "error: " "$TMP/dup.same.log" | head -1
  echo "1. a second node rank 1 (same host, other host) refused in $(elapsed "$T0" "$T1") s; the job still serves"

  # --- 2. node 1's supervisor stops while a stream runs
  # stream K: a 4000-token completion streamed into stream.K.txt. The head declares node 1 dead 9-10 s
  # after the stop; stream 0 runs from before it, and on a host fast enough to finish one before that,
  # one more starts every second from 5 s on, so that one is in flight when the failure comes.
  stream() {
    ip netns exec "$A" curl -sS -N -m 90 -H 'Content-Type: application/json' "$URL/v1/completions" \
      -d "{\"prompt\":[$PROMPT],\"max_tokens\":4000,\"ignore_eos\":true,\"stream\":true}" \
      >"$TMP/stream.$1.txt" 2>&1 &
    CURLS+=($!)
  }
  CURLS=()
  stream 0
  for _ in $(seq 1 200); do [ "$(grep -c '^data: ' "$TMP/stream.0.txt")" -ge 3 ] && break; sleep 0.1; done
  [ "$(grep -c '^data: ' "$TMP/stream.0.txt")" -ge 3 ] || FAIL "the stream did not start: $(head -c 300 "$TMP/stream.0.txt")"
  T0=$(date +%s.%N)
  kill -STOP "$NODE"
  SAW_503="" HEAD_RC=""
  for i in $(seq 1 400); do  # 40 s
    if ! kill -0 "$HEAD" 2>/dev/null; then wait "$HEAD"; HEAD_RC=$?; break; fi
    if [ -z "$SAW_503" ] && [ "$(health)" = 503 ]; then SAW_503=$(date +%s.%N); fi
    [ -z "$SAW_503" ] && [ "$i" -ge 50 ] && [ $((i % 10)) = 0 ] && stream "$i"
    sleep 0.1
  done
  T1=$(date +%s.%N)
  for c in "${CURLS[@]}"; do wait "$c" 2>/dev/null; done
  [ -n "$SAW_503" ] || FAIL "/health never answered 503 after node 1 stopped"
  [ -z "$SAW_503" ] || python3 -c "import sys; sys.exit(float(sys.argv[2]) - float(sys.argv[1]) > 30)" "$T0" "$SAW_503" ||
    FAIL "/health answered 503 only $(elapsed "$T0" "$SAW_503") s after node 1 stopped"
  [ -n "$HEAD_RC" ] || FAIL "the head still runs 40 s after node 1 stopped"
  [ "${HEAD_RC:-0}" != 0 ] || FAIL "the head exited 0 after node 1 stopped"
  has "$TMP/dup.head.log" "error: .*node 1 (10.84.0.2).*no heartbeat"
  # No stream ends with finish_reason "abort"; one in flight at the failure ends with an error event
  # naming node 1 (a stream started after it is refused: 503, no events).
  python3 - "$TMP"/stream.*.txt <<'PY' || FAIL "no stream ended with an error event naming node 1, or one was aborted"
import json, sys
named = []
for path in sys.argv[1:]:
    events = [l[6:] for l in open(path) if l.startswith("data: ") and l.strip() != "data: [DONE]"]
    chunks = [json.loads(e) for e in events]
    reasons = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert "abort" not in reasons, (path, reasons[-3:])
    named += [c["error"]["message"] for c in chunks if "error" in c and "node 1 (10.84.0.2)" in c["error"]["message"]]
assert named, "no error event naming node 1 in %d stream(s)" % len(sys.argv[1:])
print("   %d stream(s); the last event of one:" % len(sys.argv[1:]), named[0][:160])
PY
  kill -CONT "$NODE"
  T2=$(date +%s.%N)
  wait_pid "$NODE" 30 || FAIL "node 1 still runs 30 s after SIGCONT"
  T3=$(date +%s.%N)
  [ "${RC:-0}" != 0 ] || FAIL "node 1 exited 0 after the head declared it dead"
  has "$TMP/dup.node.log" "error: node 1: the head at 10.84.0.1:29610 declared this node dead: node 1 (10.84.0.2), rank 1: no heartbeat for"
  grep -h "error: node 1" "$TMP/dup.node.log" | head -1
  echo "2. node 1 stopped mid-stream: /health 503 after $(elapsed "$T0" "${SAW_503:-$T0}") s, head exited ${HEAD_RC:-?} after $(elapsed "$T0" "$T1") s; node 1 exited ${RC:-?} $(elapsed "$T2" "$T3") s after SIGCONT"
fi
for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done

# --- 3. the head killed
if start_pair kill 29611; then
  T0=$(date +%s.%N)
  kill -9 "$HEAD"
  wait_pid "$NODE" 30 || FAIL "node 1 still runs 30 s after the head was killed"
  T1=$(date +%s.%N)
  [ "${RC:-0}" != 0 ] || FAIL "node 1 exited 0 after the head was killed"
  lacks "$TMP/kill.node.log" "still connected"
  has "$TMP/kill.node.log" "error: node 1: the head at 10.84.0.1:29611 is gone"
  grep -h "error: node 1" "$TMP/kill.node.log" | head -1
  echo "3. head killed: node 1 exited ${RC:-?} in $(elapsed "$T0" "$T1") s, saying the head is gone"
fi

echo "total $(elapsed "$T_START" "$(date +%s.%N)") s"
[ $fail = 0 ] && echo "PASS: cluster faults across two namespaces"
exit $fail
