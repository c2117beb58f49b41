#!/usr/bin/env bash
# Two "hosts" on one machine running the real binary: network namespaces A and B joined by
# a veth pair (named ens1, as a physical NIC), each with decoys (docker0 and eno9 on other
# subnets). Node 0 (the head) runs in A, node 1 in B, one rank each (--nnodes 2
# --tensor-parallel-size 2). Checks:
#   1. generate: greedy token ids equal TP=1 on the same fixture; both nodes chose ens1 by
#      themselves (their log lines); both exit 0.
#   2. serve head + node: `tessera cluster status` from B lists both nodes alive on ens1 while
#      the job runs; a completion over HTTP equals `tessera generate`'s text; then node 1's
#      rank is killed: the head exits non-zero naming rank 1 / node 1 within 30 s, node 1
#      exits non-zero too.
#   3. restart: the same two nodes started again right away on the same port run the job.
#   4. faults, each a clear message: wrong --cluster-token, a shard file that differs on
#      node 1 (one byte of its safetensors header flipped: refused naming node 1 and the
#      file), wrong --nic, unreachable master.
#   netns_generate_test.sh TESSERA_BIN
# Exit 77 (ctest SKIP) when not root or when namespaces cannot be created here.
set -uo pipefail
BIN=${1:?usage: netns_generate_test.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
MODEL="$ROOT/tests/fixtures/models/qwen3_gqa4_hd32"
TOK="$ROOT/.npm-pkgs/tokenizer-qwen3/package/models"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }

A=tsg_a_$$
B=tsg_b_$$
TMP=$(mktemp -d /tmp/tessera-netns-gen.XXXXXX)
chmod 755 "$TMP"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns pids "$A" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$B" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; rm -rf "$TMP"
}
trap cleanup EXIT
if ! ip netns add "$A" 2>/dev/null; then echo "SKIP: ip netns add failed (no CAP_SYS_ADMIN?)"; exit 77; fi
ip netns add "$B" || { echo "SKIP: second namespace failed"; exit 77; }
set -e
ip link add tsgva$$ type veth peer name tsgvb$$
ip link set tsgva$$ netns "$A"
ip link set tsgvb$$ netns "$B"
ip -n "$A" link set tsgva$$ name ens1
ip -n "$B" link set tsgvb$$ name ens1
ip -n "$A" addr add 10.78.0.1/24 dev ens1
ip -n "$B" addr add 10.78.0.2/24 dev ens1
for ns in "$A" "$B"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set ens1 up
  ip -n "$ns" link add docker0 type veth peer name eno9
  ip -n "$ns" link set docker0 up
  ip -n "$ns" link set eno9 up
done
ip -n "$A" addr add 172.17.0.1/16 dev docker0
ip -n "$B" addr add 172.17.0.2/16 dev docker0
ip -n "$A" addr add 192.168.51.1/24 dev eno9
ip -n "$B" addr add 192.168.51.2/24 dev eno9
set +e

fail=0
FAIL() { echo "FAIL: $*"; fail=1; }
has() { grep -q -- "$2" "$1" || { FAIL "$1 lacks '$2'"; echo "--- $1"; tail -20 "$1"; }; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }
PORT=29571
TOKEN=netns-gen-token
PROMPTS=(--prompt-ids 39,7,201,5,88 --prompt-ids 12,240,1,66,3,9,100,101,102 --prompt-ids 250)
GEN=(generate --model "$MODEL" --device cpu --json --ignore-eos --max-tokens 16 "${PROMPTS[@]}")
ids() { python3 -c '
import json, sys
print([json.loads(l)["token_ids"] for l in open(sys.argv[1]) if l.startswith("{")])' "$1"; }

# --- reference: one rank, no namespace
"$BIN" "${GEN[@]}" >"$TMP/ref.jsonl" 2>"$TMP/ref.log" || { echo "FAIL: TP=1 reference failed"; cat "$TMP/ref.log"; exit 1; }
REF="$(ids "$TMP/ref.jsonl")"
[ "$(python3 -c "import sys; print(len(eval(sys.argv[1])))" "$REF")" = 3 ] || { echo "FAIL: reference: $REF"; exit 1; }

# run_pair TAG PORT [extra flags for both]: generate on both nodes; sets HEAD_RC NODE_RC.
run_pair() {
  local tag="$1" port="$2"; shift 2
  local common=("${GEN[@]}" --nnodes 2 --master-addr 10.78.0.1 --master-port "$port"
                --cluster-token "$TOKEN" --join-timeout 30 "$@")
  ip netns exec "$A" timeout 90 "$BIN" "${common[@]}" --node-rank 0 >"$TMP/$tag.head.jsonl" 2>"$TMP/$tag.head.log" &
  local h=$!
  ip netns exec "$B" timeout 90 "$BIN" "${common[@]}" --node-rank 1 >"$TMP/$tag.node.out" 2>"$TMP/$tag.node.log" &
  local n=$!
  wait $h; HEAD_RC=$?
  wait $n; NODE_RC=$?
}

# --- 1. generate across the namespaces
T0=$(date +%s.%N)
run_pair gen $PORT --tensor-parallel-size 2
T1=$(date +%s.%N)
[ $HEAD_RC = 0 ] || FAIL "head exited $HEAD_RC"
[ $NODE_RC = 0 ] || FAIL "node 1 exited $NODE_RC"
GOT="$(ids "$TMP/gen.head.jsonl")"
[ "$GOT" = "$REF" ] || FAIL "two-node TP=2 tokens differ from TP=1:
  want $REF
  got  $GOT"
has "$TMP/gen.head.log" "NIC ens1 (10.78.0.1)"
has "$TMP/gen.node.log" "NIC ens1 (10.78.0.2)"
has "$TMP/gen.head.log" "node 0 of 2: NIC ens1 (10.78.0.1), world ranks 0..0 of 2"
has "$TMP/gen.node.log" "node 1 of 2: NIC ens1 (10.78.0.2), world ranks 1..1 of 2"
# Rank 0 binds Gloo to ens1's address; node 1's rank to its own; both use the head's control channel.
has "$TMP/gen.head.log" "this node runs ranks 0..0 on 10.78.0.1, control channel 10.78.0.1:$PORT"
has "$TMP/gen.node.log" "this node runs ranks 1..1 on 10.78.0.2, control channel 10.78.0.1:$PORT"
echo "1. generate over two namespaces: tokens = TP=1 ($(elapsed "$T0" "$T1") s for both nodes)"

# TP inside each node, PP across them (the seeds' layout): 2 ranks per node, world ranks
# node by node (node 1 runs ranks 2 and 3, pipeline stage 1).
run_pair tppp $((PORT + 9)) --tensor-parallel-size 2 --pipeline-parallel-size 2
[ $HEAD_RC = 0 ] && [ $NODE_RC = 0 ] || FAIL "TP=2 x PP=2 over two nodes: head $HEAD_RC, node $NODE_RC"
[ "$(ids "$TMP/tppp.head.jsonl")" = "$REF" ] || FAIL "TP=2 x PP=2 over two nodes: tokens differ from TP=1"
has "$TMP/tppp.node.log" "this node runs ranks 2..3 on 10.78.0.2"
echo "1b. TP=2 x PP=2, two ranks per node: tokens = TP=1"

# --- 2. serve head + node 1, cluster status, HTTP, then a killed rank on node 1
if [ -f "$TOK/tokenizer.json" ]; then
  SP=$((PORT + 1))
  SERVE=(serve "$MODEL" --tokenizer "$TOK" --device cpu --host 127.0.0.1 --port 0 --served-model-name fx
         --max-model-len 512 --disable-uvicorn-access-log --tensor-parallel-size 2 --nnodes 2
         --master-addr 10.78.0.1 --master-port $SP --cluster-token "$TOKEN" --join-timeout 30)
  ip netns exec "$A" "$BIN" "${SERVE[@]}" --node-rank 0 >"$TMP/serve.head.log" 2>&1 &
  SH=$!; PIDS+=($SH)
  ip netns exec "$B" "$BIN" "${SERVE[@]}" --node-rank 1 >"$TMP/serve.node.log" 2>&1 &
  SN=$!; PIDS+=($SN)
  HTTP=""
  for _ in $(seq 1 600); do
    HTTP="$(sed -n 's/.*Starting tessera API server on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$TMP/serve.head.log" | head -1)"
    [ -n "$HTTP" ] && break
    kill -0 $SH 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$HTTP" ]; then
    FAIL "serve head did not start"; tail -20 "$TMP/serve.head.log" "$TMP/serve.node.log"
  else
    ip netns exec "$B" "$BIN" cluster status --master-addr 10.78.0.1 --master-port $SP --cluster-token "$TOKEN" \
      >"$TMP/status.log" 2>&1 || FAIL "cluster status exited $?"
    cat "$TMP/status.log"
    has "$TMP/status.log" "2/2 nodes joined, formed, 2 ranks"
    grep -Eq "^0 .*10\.78\.0\.1 +ens1 .*alive" "$TMP/status.log" || FAIL "status: node 0 not alive on ens1"
    grep -Eq "^1 .*10\.78\.0\.2 +ens1 .*alive" "$TMP/status.log" || FAIL "status: node 1 not alive on ens1"
    ip netns exec "$A" curl -sS -H 'Content-Type: application/json' "http://127.0.0.1:$HTTP/v1/completions" \
      -d '{"model":"fx","prompt":[39,7,201,5,88],"max_tokens":16,"temperature":0,"ignore_eos":true}' >"$TMP/http.json"
    "$BIN" generate --model "$MODEL" --tokenizer "$TOK" --device cpu --json --ignore-eos --max-tokens 16 \
      --prompt-ids 39,7,201,5,88 >"$TMP/http_ref.jsonl" 2>/dev/null
    python3 - "$TMP/http.json" "$TMP/http_ref.jsonl" <<'PY' || FAIL "served text differs from generate"
import json, sys
got = json.load(open(sys.argv[1]))["choices"][0]["text"]
want = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")][0]["text"]
print("   served over two nodes:", json.dumps(got)[:80])
assert got == want and got, (got, want)
PY
    RANK1="$(cat /proc/$SN/task/$SN/children 2>/dev/null | awk '{print $1}')"
    # $SN is `ip netns exec`, which execs the binary: its child is the rank process.
    if [ -z "$RANK1" ]; then FAIL "no rank process under node 1"; else
      T0=$(date +%s.%N)
      kill -9 "$RANK1"
      HRC=""
      for _ in $(seq 1 3000); do
        if ! kill -0 $SH 2>/dev/null; then wait $SH; HRC=$?; break; fi
        sleep 0.01
      done
      T1=$(date +%s.%N)
      [ -n "$HRC" ] || FAIL "the head did not exit within 30 s of rank 1's death"
      [ "${HRC:-0}" != 0 ] || FAIL "the head exited 0 after rank 1 died"
      grep -q "error: .*\(rank 1\|node 1\)" "$TMP/serve.head.log" || FAIL "the head's error does not name rank 1 / node 1"
      grep "error: " "$TMP/serve.head.log" | head -2
      for _ in $(seq 1 100); do kill -0 $SN 2>/dev/null || break; sleep 0.1; done
      wait $SN; NRC=$?
      [ "$NRC" != 0 ] || FAIL "node 1 exited 0 after its rank died"
      grep -q "error: node 1: rank 1 (pid $RANK1) was killed by signal 9" "$TMP/serve.node.log" ||
        FAIL "node 1 does not name its dead rank"
      echo "2. serve: cluster status lists both nodes; head exited $HRC $(elapsed "$T0" "$T1") s after node 1's rank was killed"
    fi
  fi
else
  echo "2. serve part skipped: $TOK/tokenizer.json missing (scripts/fetch_test_data.sh)"
fi

# --- 3. the same nodes restarted at once on the same port
run_pair again $PORT --tensor-parallel-size 2
[ $HEAD_RC = 0 ] && [ $NODE_RC = 0 ] || FAIL "restart on the same port: head $HEAD_RC, node $NODE_RC"
[ "$(ids "$TMP/again.head.jsonl")" = "$REF" ] || FAIL "restarted job: tokens differ"
echo "3. restarted nodes rejoined on the same port: tokens = TP=1"

# --- 4. faults
FP=$((PORT + 2))
fault_pair() {  # fault_pair TAG HEAD_FLAGS -- NODE_FLAGS: head with a short join timeout
  local tag="$1"; shift
  local hf=() nf=()
  while [ "$1" != "--" ]; do hf+=("$1"); shift; done; shift
  nf=("$@")
  local base=(--device cpu --json --max-tokens 4 --prompt-ids 1,2,3 --tensor-parallel-size 2 --nnodes 2
              --master-addr 10.78.0.1 --master-port "$FP" --join-timeout 8)
  ip netns exec "$A" timeout 60 "$BIN" generate "${base[@]}" --node-rank 0 "${hf[@]}" >/dev/null 2>"$TMP/$tag.head.log" &
  local h=$!
  T0=$(date +%s.%N)
  ip netns exec "$B" timeout 60 "$BIN" generate "${base[@]}" --node-rank 1 "${nf[@]}" >/dev/null 2>"$TMP/$tag.node.log"
  NODE_RC=$?
  T1=$(date +%s.%N)
  wait $h; HEAD_RC=$?
  FP=$((FP + 1))
}
fault_pair token --model "$MODEL" --cluster-token "$TOKEN" -- --model "$MODEL" --cluster-token wrong-token
[ $NODE_RC != 0 ] && [ $HEAD_RC != 0 ] || FAIL "wrong token: node $NODE_RC head $HEAD_RC"
grep "error:" "$TMP/token.node.log" | head -1
has "$TMP/token.node.log" "token"
has "$TMP/token.head.log" "never joined"
echo "4a. wrong token: node 1 refused in $(elapsed "$T0" "$T1") s"

cp -r "$MODEL" "$TMP/m_node1"
python3 - "$TMP/m_node1/model.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
i = 8 + bytes(b[8:8 + n]).index(b'"dtype"') + 1  # a byte inside the JSON header: d -> e
b[i] ^= 0x01
open(p, "wb").write(b)
PY
fault_pair shard --model "$MODEL" --cluster-token "$TOKEN" -- --model "$TMP/m_node1" --cluster-token "$TOKEN"
[ $NODE_RC != 0 ] && [ $HEAD_RC != 0 ] || FAIL "differing shard: node $NODE_RC head $HEAD_RC"
grep "error:" "$TMP/shard.node.log" | head -1
has "$TMP/shard.node.log" "node 1"
has "$TMP/shard.node.log" "model.safetensors differs from the head's"
echo "4b. differing shard on node 1: refused in $(elapsed "$T0" "$T1") s"

ip netns exec "$B" timeout 30 "$BIN" "${GEN[@]}" --tensor-parallel-size 2 --nnodes 2 --node-rank 1 \
  --master-addr 10.78.0.1 --master-port $FP --cluster-token "$TOKEN" --nic eth9 >/dev/null 2>"$TMP/nic.log"
[ $? != 0 ] || FAIL "wrong --nic exited 0"
has "$TMP/nic.log" "interface eth9 does not exist; interfaces here:"
ip netns exec "$B" timeout 30 "$BIN" "${GEN[@]}" --tensor-parallel-size 2 --nnodes 2 --node-rank 1 \
  --master-addr 10.99.0.1 --master-port $FP --cluster-token "$TOKEN" >/dev/null 2>"$TMP/noroute.log"
[ $? != 0 ] || FAIL "unreachable master exited 0"
has "$TMP/noroute.log" "no interface routes to 10.99.0.1"
echo "4c. wrong --nic and unreachable master: clear errors"

[ $fail = 0 ] && echo "PASS: two-node generate/serve across namespaces"
exit $fail
