#!/usr/bin/env bash
# torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
# set by hand as torchrun sets them, across two network namespaces; CPU ranks of the demo model;
# the commands of docs/distributed.md ("torchrun"). Checks:
#   1. one process per rank (two per host), `generate` TP=2 x PP=2: one rank's tokens; rank 3
#      says where its facts came from.
#   2. one process per host, `serve` TP=2: /health on rank 0, a completion equal to one rank's,
#      then node 1's rank is killed: the head exits non-zero naming it within 30 s.
#   3. --node-rank 0 on the process whose RANK is 1: refused, naming both sides; node rank 0 on
#      the host that is not the master (every node got rank 0): refused at once.
#   netns_torchrun_test.sh TESSERA_BIN     (root; exit 77 = skipped)
set -uo pipefail
BIN="$(readlink -f "${1:?usage: netns_torchrun_test.sh TESSERA_BIN}")"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODEL="$ROOT/models/tessera-demo"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
# shellcheck source=netns_hosts.sh
source "$HERE/netns_hosts.sh"
TMP=$(mktemp -d /tmp/tessera-netns-torchrun.XXXXXX)
chmod 755 "$TMP"
netns_hosts_up ttr 10.82.0
T_START=$(date +%s.%N)

# shellcheck source=launch_checks.sh
source "$HERE/launch_checks.sh"
"$BIN" generate --model "$MODEL" "${GEN[@]}" >"$TMP/ref.jsonl" 2>"$TMP/ref.log" || { echo "FAIL: one-rank reference"; cat "$TMP/ref.log"; exit 1; }
REF="$(ids "$TMP/ref.jsonl")"
REF_TEXT="$(python3 -c 'import json, sys; print([json.loads(l)["text"] for l in open(sys.argv[1]) if l.startswith("{")][0])' "$TMP/ref.jsonl")"

# start TAG RANK WORLD LOCAL_WORLD ARGS...: one process as torchrun would start it, on host A for
# the ranks of node 0 and host B for the others; its pid goes to RPIDS[RANK], its output to TAG.RANK.log.
RPIDS=()
start() {
  local tag="$1" rank="$2" world="$3" lw="$4"; shift 4
  local ns=$A
  [ $((rank / lw)) -ge 1 ] && ns=$B
  ip netns exec "$ns" env RANK="$rank" WORLD_SIZE="$world" LOCAL_RANK=$((rank % lw)) LOCAL_WORLD_SIZE="$lw" \
    MASTER_ADDR=10.82.0.1 MASTER_PORT=29600 TESSERA_CLUSTER_TOKEN=netns-torchrun-token \
    "$BIN" "$@" >"$TMP/$tag.$rank.log" 2>&1 &
  RPIDS[$rank]=$!
  PIDS+=($!)
}
wait_pid() {  # wait_pid PID SECONDS: sets RC once PID exited, returns 1 if it still runs
  for _ in $(seq 1 $(($2 * 10))); do
    if ! kill -0 "$1" 2>/dev/null; then wait "$1"; RC=$?; return 0; fi
    sleep 0.1
  done
  return 1
}

# --- 1. one process per rank, generate TP=2 x PP=2
T0=$(date +%s.%N)
for r in 0 1 2 3; do start t1 $r 4 2 generate --model "$MODEL" "${GEN[@]}" --tensor-parallel-size 2 --pipeline-parallel-size 2; done
for r in 0 1 2 3; do
  wait_pid "${RPIDS[$r]}" 60 || { FAIL "rank $r still runs after 60 s"; kill -9 "${RPIDS[$r]}"; }
  [ "$RC" = 0 ] || { FAIL "rank $r exited $RC"; tail -n 5 "$TMP/t1.$r.log"; }
done
T1=$(date +%s.%N)
GOT="$(ids "$TMP/t1.0.log")"
[ "$GOT" = "$REF" ] || FAIL "one process per rank: tokens differ from one rank: want $REF got $GOT"
has "$TMP/t1.0.log" "launch from torchrun: node 0 of 2, rank 0 of 4 (local 0 of 2), one process per rank, master 10.82.0.1:29600 (from MASTER_ADDR)"
has "$TMP/t1.0.log" "(ranks 1..1 started by the launcher)"
echo "1. torchrun variables, one process per rank, generate TP=2 x PP=2: tokens = one rank ($(elapsed "$T0" "$T1") s)"

# --- 2. one process per host, serve TP=2, node 1's rank killed
T0=$(date +%s.%N)
for r in 0 1; do start t2 $r 2 1 serve "$MODEL" --device cpu --tensor-parallel-size 2 --host 0.0.0.0 --port 8000; done
PORT=""
for _ in $(seq 1 600); do
  grep -q "Application startup complete" "$TMP/t2.0.log" && { PORT=8000; break; }
  kill -0 "${RPIDS[0]}" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$PORT" ]; then FAIL "serve: rank 0 did not serve within 60 s"; tail -n 20 "$TMP/t2.0.log" "$TMP/t2.1.log"; else
  [ "$(ip netns exec "$A" curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] ||
    FAIL "serve: /health on rank 0 is not 200"
  ip netns exec "$A" curl -sS -H 'Content-Type: application/json' "http://127.0.0.1:$PORT/v1/completions" \
    -d "{\"prompt\":[$PROMPT],\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}" >"$TMP/t2.http.json"
  python3 - "$TMP/t2.http.json" "$REF_TEXT" <<'PY' || FAIL "serve: text differs from one rank's"
import json, sys
got = json.load(open(sys.argv[1]))["choices"][0]["text"]
assert got == sys.argv[2] and got, (got, sys.argv[2])
PY
  T1=$(date +%s.%N)
  VICTIM="$(cat "/proc/${RPIDS[1]}/task/${RPIDS[1]}/children" 2>/dev/null | awk '{print $1}')"
  if [ -z "$VICTIM" ]; then FAIL "no rank process under node 1"; else
    kill -9 "$VICTIM"
    wait_pid "${RPIDS[0]}" 30 || FAIL "the head still runs 30 s after rank 1 was killed"
    T2=$(date +%s.%N)
    [ "${RC:-0}" != 0 ] || FAIL "the head exited 0 after rank 1 was killed"
    grep -q "error: .*rank 1" "$TMP/t2.0.log" || FAIL "the head's error does not name rank 1: $(grep error "$TMP/t2.0.log" | tail -2)"
    grep -h "error: " "$TMP/t2.0.log" | head -1
    echo "2. torchrun variables, one process per host, serve TP=2: /health and text after $(elapsed "$T0" "$T1") s; killed rank 1 named, head exited $RC in $(elapsed "$T1" "$T2") s"
  fi
fi
for r in 0 1; do kill -9 "${RPIDS[$r]}" 2>/dev/null; done

# --- 3. a flag contradicting RANK
ip netns exec "$B" env RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.82.0.1 \
  TESSERA_CLUSTER_TOKEN=t "$BIN" generate --model "$MODEL" "${GEN[@]}" --tensor-parallel-size 2 --node-rank 0 \
  >/dev/null 2>"$TMP/t3.log"
[ $? != 0 ] || FAIL "--node-rank 0 with RANK=1 exited 0"
has "$TMP/t3.log" "--node-rank 0 contradicts RANK=1 (from the launcher's environment)"
# Every node given rank 0 (no launcher variables): the one that is not the master refuses at once.
ip netns exec "$B" env TESSERA_CLUSTER_TOKEN=t "$BIN" generate --model "$MODEL" "${GEN[@]}" --tensor-parallel-size 2 \
  --nnodes 2 --node-rank 0 --master-addr 10.82.0.1 >/dev/null 2>"$TMP/t3b.log"
[ $? != 0 ] || FAIL "node rank 0 away from the master exited 0"
has "$TMP/t3b.log" "this process is node 0 of 2 (the head) but the master address 10.82.0.1 (from --master-addr, 10.82.0.1) is not an address of this host"
echo "3. --node-rank contradicting RANK, and node rank 0 away from the master: refused"

echo "total $(elapsed "$T_START" "$(date +%s.%N)") s"
[ $fail = 0 ] && echo "PASS: torchrun's variables across two namespaces"
exit $fail
