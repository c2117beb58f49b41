#!/usr/bin/env bash
# The seeds' production shape across two "hosts" (network namespaces A and B joined by a veth
# pair named ens1): MTP speculative decoding (k = 2) on the demo model, which ships an MTP layer,
# with TP 2 x PP 2 (two ranks a node: TP inside a node, the pipeline across the link) and with
# TP 2 alone (one rank a node: every all-reduce crosses the link), started both ways tessera starts
# a job on several nodes:
#   1. per node: `tessera generate ... --nnodes 2 --node-rank R --master-addr` in each namespace;
#   2. a cluster: `tessera node start --head` in A, `tessera node start --address` in B, then
#      `tessera generate ... --distributed-executor-backend ray` on the head.
# Each run's greedy tokens must equal one rank's without speculation, and the drafts accepted,
# overall and per position, one rank's with MTP (drafting on at every batch:
# disable_by_batch_size 0, since the automatic limit measures step times that differ between runs).
#   netns_mtp_test.sh TESSERA_BIN
# Exit 77 (ctest SKIP) when not root or when namespaces cannot be created here.
set -uo pipefail
BIN=${1:?usage: netns_mtp_test.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
MODEL="$ROOT/models/tessera-demo"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
[ -f "$MODEL/model.safetensors" ] || { echo "SKIP: $MODEL/model.safetensors missing"; exit 77; }

TMP=$(mktemp -d /tmp/tessera-netns-mtp.XXXXXX)
chmod 755 "$TMP"
source "$(dirname "$0")/netns_hosts.sh"
netns_hosts_up tsm 10.83.0

fail=0
FAIL() { echo "FAIL: $*"; fail=1; }
has() { grep -q -- "$2" "$1" || { FAIL "$1 lacks '$2'"; echo "--- $1"; tail -20 "$1"; }; }
wait_for() {  # wait_for FILE TEXT SECONDS
  for _ in $(seq 1 $(($3 * 10))); do grep -q -- "$2" "$1" && return 0; sleep 0.1; done
  FAIL "$1: no '$2' within $3 s"; tail -20 "$1"; return 1
}
TOKEN=netns-mtp-token
PORT=29681
MTP='{"method":"mtp","num_speculative_tokens":2,"disable_by_batch_size":0}'
GEN=(generate --model "$MODEL" --device cpu --json --ignore-eos --max-tokens 40
     --prompt "The history of the city begins with a small village by the river."
     --prompt "Once upon a time, there was a little girl who" --prompt-ids 39,7,201,5,88)
ids() { python3 -c '
import json, sys
print([json.loads(l)["token_ids"] for l in open(sys.argv[1]) if l.startswith("{")])' "$1"; }
# "Accepted: N tokens, Drafted: M tokens, Per-position acceptance rate: ..." of the SpecDecoding line.
acceptance() { python3 -c '
import sys
t = open(sys.argv[1], errors="replace").read()
i = t.rfind("SpecDecoding metrics:")
a, b = t.find("Accepted: ", i), t.find(", Avg Draft", i)
print(t[a:b] if i >= 0 and 0 <= a < b else "")' "$1"; }

# --- reference: one rank, no namespace; without speculation, then with MTP
"$BIN" "${GEN[@]}" >"$TMP/plain.jsonl" 2>"$TMP/plain.log" || { echo "FAIL: one-rank reference failed"; cat "$TMP/plain.log"; exit 1; }
REF="$(ids "$TMP/plain.jsonl")"
[ "$(python3 -c "import sys; print(len(eval(sys.argv[1])))" "$REF")" = 3 ] || { echo "FAIL: reference: $REF"; exit 1; }
"$BIN" "${GEN[@]}" --speculative-config "$MTP" >"$TMP/one.jsonl" 2>"$TMP/one.log" ||
  { echo "FAIL: one-rank MTP failed"; cat "$TMP/one.log"; exit 1; }
[ "$(ids "$TMP/one.jsonl")" = "$REF" ] || FAIL "one rank with MTP: tokens differ from one rank without"
ACC="$(acceptance "$TMP/one.log")"
[ -n "$ACC" ] || { echo "FAIL: no SpecDecoding line in the one-rank MTP run"; tail -5 "$TMP/one.log"; exit 1; }
case "$ACC" in "Accepted: 0 tokens"*) echo "FAIL: no draft accepted on one rank: $ACC"; exit 1 ;; esac
echo "reference: one rank, MTP k=2: $ACC"

# check TAG OUT LOG: the run's tokens and acceptance against the references.
check() {
  [ "$(ids "$2")" = "$REF" ] || FAIL "$1: tokens differ from one rank without speculation:
  want $REF
  got  $(ids "$2")"
  [ "$(acceptance "$3")" = "$ACC" ] || FAIL "$1: acceptance differs from one rank's:
  want $ACC
  got  $(acceptance "$3")"
}

# --- 1. per-node flags: each namespace runs its node of the job
run_pair() {  # run_pair TAG PORT FLAGS...: sets HEAD_RC NODE_RC
  local tag="$1" port="$2"; shift 2
  local common=("${GEN[@]}" --speculative-config "$MTP" --nnodes 2 --master-addr 10.83.0.1
                --master-port "$port" --cluster-token "$TOKEN" --join-timeout 60 "$@")
  ip netns exec "$A" timeout 180 "$BIN" "${common[@]}" --node-rank 0 >"$TMP/$tag.head.jsonl" 2>"$TMP/$tag.head.log" &
  local h=$!
  ip netns exec "$B" timeout 180 "$BIN" "${common[@]}" --node-rank 1 >"$TMP/$tag.node.out" 2>"$TMP/$tag.node.log" &
  local n=$!
  wait $h; HEAD_RC=$?
  wait $n; NODE_RC=$?
}
run_pair tppp $PORT --tensor-parallel-size 2 --pipeline-parallel-size 2
[ $HEAD_RC = 0 ] && [ $NODE_RC = 0 ] || { FAIL "TP 2 x PP 2, per node: head $HEAD_RC, node $NODE_RC"; tail -15 "$TMP/tppp.head.log" "$TMP/tppp.node.log"; }
check "TP 2 x PP 2, per node" "$TMP/tppp.head.jsonl" "$TMP/tppp.head.log"
has "$TMP/tppp.node.log" "this node runs ranks 2..3 on 10.83.0.2"
# The startup log says what a decode step sends between the nodes: the pipeline's one stage send.
has "$TMP/tppp.head.log" "Network per batch-1 decode step between the 2 nodes: 1 stage send + 3 plan broadcasts and token returns"
echo "1. per node, TP 2 x PP 2 (pipeline across the link), MTP k=2: tokens and acceptance = one rank"
run_pair tp $((PORT + 5)) --tensor-parallel-size 2
[ $HEAD_RC = 0 ] && [ $NODE_RC = 0 ] || { FAIL "TP 2, per node: head $HEAD_RC, node $NODE_RC"; tail -15 "$TMP/tp.head.log" "$TMP/tp.node.log"; }
check "TP 2, per node" "$TMP/tp.head.jsonl" "$TMP/tp.head.log"
has "$TMP/tp.head.log" "Network per batch-1 decode step between the 2 nodes: [0-9]* all-reduces + 3 logits gathers"
echo "1b. per node, TP 2 (all-reduces across the link), MTP k=2: tokens and acceptance = one rank"

# --- 2. a cluster: node start on both hosts, the job placed on it by the head
export TESSERA_STATE_DIR="$TMP/state" TESSERA_CLUSTER_TOKEN=$TOKEN
CP=$((PORT + 10))
ip netns exec "$A" "$BIN" node start --head --port $CP --node-ip-address 10.83.0.1 --num-gpus 2 >"$TMP/chead.log" 2>&1 &
PIDS+=($!)
wait_for "$TMP/chead.log" "tessera cluster head started at 10.83.0.1:$CP" 15
ip netns exec "$B" "$BIN" node start --address 10.83.0.1:$CP \
  --node-ip-address 10.83.0.2 --num-gpus 2 --block >"$TMP/cworker.log" 2>&1 &
PIDS+=($!)
wait_for "$TMP/cworker.log" "joined the tessera cluster at 10.83.0.1:$CP as node 1" 15
ip netns exec "$A" timeout 180 "$BIN" "${GEN[@]}" --speculative-config "$MTP" --tensor-parallel-size 2 \
  --pipeline-parallel-size 2 --distributed-executor-backend ray >"$TMP/ray.jsonl" 2>"$TMP/ray.log"
RC=$?
[ $RC = 0 ] || { FAIL "TP 2 x PP 2 on the cluster exited $RC"; tail -20 "$TMP/ray.log"; tail -10 "$TMP/cworker.log"; }
check "TP 2 x PP 2 on the cluster" "$TMP/ray.jsonl" "$TMP/ray.log"
has "$TMP/ray.log" "4 rank(s) on 2 nodes of the cluster at 10.83.0.1:$CP"
has "$TMP/ray.log" "Network per batch-1 decode step between the 2 nodes: 1 stage send"
echo "2. node start + --distributed-executor-backend ray, TP 2 x PP 2, MTP k=2: tokens and acceptance = one rank"

[ $fail = 0 ] && echo "PASS: MTP k=2 across two namespace nodes, both launch ways"
exit $fail
