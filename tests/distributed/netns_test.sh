#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces joined by a veth pair, each with decoys
# (docker0 and eno9, the two ends of an in-namespace veth pair). Checks that the automatic
# NIC is the veth end, that a 2-node rendezvous + Gloo all-reduce works across the
# namespaces, that `tessera cluster status` lists both nodes, that a wrong --nic and an
# unreachable master fail with clear messages, and that cutting the link makes the head
# name the lost node within the heartbeat timeout. Prints the all-reduce bandwidth
# between the namespaces.
#
#   tests/distributed/netns_test.sh path/to/dist_node [path/to/dist_cluster_cli]
# Exit 77 (ctest SKIP) when not root or when namespaces cannot be created here.
set -uo pipefail
NODE=${1:?usage: netns_test.sh path/to/dist_node [path/to/dist_cluster_cli]}
CLUSTER_CLI=${2:-}
SIZES=${DIST_BENCH_SIZES:-1048576,67108864}
ITERS=${DIST_BENCH_ITERS:-5}

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }

A=tsr_a_$$
B=tsr_b_$$
cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; rm -rf "$TMP"; }
TMP=$(mktemp -d)
trap cleanup EXIT
if ! ip netns add "$A" 2>/dev/null; then echo "SKIP: ip netns add failed (no CAP_SYS_ADMIN?)"; exit 77; fi
ip netns add "$B" || { echo "SKIP: second namespace failed"; exit 77; }

set -e
# The veth ends are named like physical NICs (ens1): that is what the hosts would see.
ip link add tsrva$$ type veth peer name tsrvb$$
ip link set tsrva$$ netns "$A"
ip link set tsrvb$$ netns "$B"
ip -n "$A" link set tsrva$$ name ens1
ip -n "$B" link set tsrvb$$ name ens1
ip -n "$A" addr add 10.77.0.1/24 dev ens1
ip -n "$B" addr add 10.77.0.2/24 dev ens1
for ns in "$A" "$B"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set ens1 up
  # Decoys on other subnets: a docker bridge look-alike and a management NIC (the two ends
  # of a veth pair kept inside the namespace; containers often lack the dummy link type).
  ip -n "$ns" link add docker0 type veth peer name eno9
  ip -n "$ns" link set docker0 up
  ip -n "$ns" link set eno9 up
done
ip -n "$A" addr add 172.17.0.1/16 dev docker0
ip -n "$B" addr add 172.17.0.2/16 dev docker0
ip -n "$A" addr add 192.168.50.1/24 dev eno9
ip -n "$B" addr add 192.168.50.2/24 dev eno9
set +e

PORT=29555
COMMON=(--nnodes 2 --master-addr 10.77.0.1 --master-port $PORT --token netns-token --expect-nic ens1
        --bench "$SIZES" --iters "$ITERS" --hold-ms 1500)
ip netns exec "$A" "$NODE" "${COMMON[@]}" --node-rank 0 >"$TMP/head.log" 2>&1 &
HEAD_PID=$!
ip netns exec "$B" timeout 60 "$NODE" "${COMMON[@]}" --node-rank 1 >"$TMP/node.log" 2>&1 &
NODE_PID=$!
if [ -n "$CLUSTER_CLI" ]; then
  # While both hold after their all-reduce, ask the head for the cluster's status from the other host.
  for _ in $(seq 1 300); do grep -q DONE "$TMP/node.log" 2>/dev/null && break; sleep 0.1; done
  ip netns exec "$B" "$CLUSTER_CLI" cluster status --master-addr 10.77.0.1 --master-port $PORT \
    --cluster-token netns-token >"$TMP/status.log" 2>&1
  STATUS_RC=$?
fi
wait $NODE_PID
NODE_RC=$?
wait $HEAD_PID
HEAD_RC=$?
echo "--- head (namespace A)"; cat "$TMP/head.log"
echo "--- node (namespace B)"; cat "$TMP/node.log"

fail=0
check() { if ! grep -q "$2" "$1"; then echo "FAIL: $1 lacks '$2'"; fail=1; fi; }
[ $HEAD_RC -eq 0 ] || { echo "FAIL: head exited $HEAD_RC"; fail=1; }
[ $NODE_RC -eq 0 ] || { echo "FAIL: node exited $NODE_RC"; fail=1; }
check "$TMP/head.log" "NIC ens1 10.77.0.1"
check "$TMP/node.log" "NIC ens1 10.77.0.2"
check "$TMP/head.log" "ALLREDUCE OK"
check "$TMP/node.log" "ALLREDUCE OK"
check "$TMP/head.log" "STATUS node 0 ens1 10.77.0.1 alive"
check "$TMP/head.log" "STATUS node 1 ens1 10.77.0.2 alive"

if [ -n "$CLUSTER_CLI" ]; then
  echo "--- tessera cluster status (from namespace B)"; cat "$TMP/status.log"
  [ "$STATUS_RC" -eq 0 ] || { echo "FAIL: cluster status exited $STATUS_RC"; fail=1; }
  check "$TMP/status.log" "2/2 nodes joined, formed, 2 ranks"
  if ! grep -E "^0 .*10\.77\.0\.1 +ens1 .*alive" "$TMP/status.log" >/dev/null ||
     ! grep -E "^1 .*10\.77\.0\.2 +ens1 .*alive" "$TMP/status.log" >/dev/null; then
    echo "FAIL: status does not list both nodes alive on ens1"; fail=1
  fi
fi

# A wrong --nic is a clear error, not a hang.
ip netns exec "$B" timeout 20 "$NODE" --nnodes 2 --node-rank 1 --master-addr 10.77.0.1 --master-port $PORT \
  --token netns-token --nic eth9 >"$TMP/wrong.log" 2>&1
check "$TMP/wrong.log" "interface eth9 does not exist; interfaces here:"
# An unreachable master is named, within the join timeout.
ip netns exec "$B" timeout 60 "$NODE" --nnodes 2 --node-rank 1 --master-addr 10.99.0.1 --master-port $PORT \
  --token netns-token >"$TMP/noroute.log" 2>&1
check "$TMP/noroute.log" "no interface routes to 10.99.0.1"

# Cut the link mid-run (no TCP reset reaches anyone): the head must name the node once its
# heartbeats stop, within the heartbeat timeout (2 s here) plus a little.
CUT=(--nnodes 2 --master-addr 10.77.0.1 --master-port $((PORT + 1)) --token netns-token --heartbeat-timeout-ms 2000)
ip netns exec "$A" timeout 60 "$NODE" "${CUT[@]}" --node-rank 0 --watch-failure-ms 10000 >"$TMP/cut_head.log" 2>&1 &
CUT_HEAD=$!
ip netns exec "$B" timeout 60 "$NODE" "${CUT[@]}" --node-rank 1 --hold-ms 30000 >"$TMP/cut_node.log" 2>&1 &
CUT_NODE=$!
for _ in $(seq 1 300); do grep -q DONE "$TMP/cut_node.log" 2>/dev/null && break; sleep 0.1; done
ip -n "$B" link set ens1 down
wait $CUT_HEAD
CUT_RC=$?
kill $CUT_NODE 2>/dev/null; wait $CUT_NODE 2>/dev/null
echo "--- link cut"; grep -E "FAILURE|NO FAILURE|error" "$TMP/cut_head.log"
[ $CUT_RC -eq 0 ] || { echo "FAIL: head did not report the cut link (exit $CUT_RC)"; fail=1; }
check "$TMP/cut_head.log" "FAILURE after .* ms: node 1 (10.77.0.2), rank 1: no heartbeat for"

[ $fail -eq 0 ] && echo "PASS: netns rendezvous + Gloo all-reduce across namespaces"
exit $fail
