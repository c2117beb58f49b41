#!/usr/bin/env bash
# `tessera doctor` across two "hosts": network namespaces A (head, node 0) and B (node 1)
# joined by a veth pair named ens1, each with decoy interfaces (docker0 / eno9 on other
# subnets). A healthy pair must be all ✓ (exit 0 on both); each injected fault must be a ✗
# line naming it, with its fix, and exit 1:
#   blocked ports     nftables in B drops new TCP connections to its ports (not the head's)
#   MTU mismatch      B's ens1 at 1400, A's at 1500
#   wrong --nic       B run with --nic =eno9 (a decoy that does not route to the head)
#   small /dev/shm    B's doctor in a private mount namespace with an 8 MiB tmpfs on /dev/shm
#   model files       B's copy of the fixture has one byte of tensor data changed: the header
#                     comparison passes, --verify-weights names the file
#   version skew      B reports another version (TESSERA_DOCTOR_FAKE_VERSION: the doctor's
#                     test hook, cheaper than a second build; it changes only what doctor reports)
# The bandwidth/latency rules are relaxed by flag (a loaded CI box is not a 10 Gb/s link);
# the seeds' defaults (1 ms, 10 Gb/s) are unit-tested through the same code path.
#   netns_doctor_test.sh TESSERA_BIN
# Exit 77 (ctest SKIP) when not root, or without ip / nft / unshare.
set -uo pipefail
BIN=${1:?usage: netns_doctor_test.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
MODEL="$ROOT/tests/fixtures/models/qwen3_gqa4_hd32"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
for c in ip nft unshare python3; do command -v $c >/dev/null || { echo "SKIP: no $c"; exit 77; }; done

TMP=$(mktemp -d /tmp/tessera-netns-doctor.XXXXXX)
chmod 755 "$TMP"
. "$(dirname "$0")/netns_hosts.sh"
netns_hosts_up tdoc 10.79.0
set -e
# Decoys on each host: a docker bridge and a second NIC that does not route to the head.
netns_hosts_decoys
set +e

# Both copies of the model start identical.
cp -r "$MODEL" "$TMP/mA"
cp -r "$MODEL" "$TMP/mB"

fail=0
FAIL() { echo "FAIL: $*"; fail=1; }
has() { grep -q -- "$2" "$1" || { FAIL "$1 lacks '$2'"; echo "--- $1"; cat "$1"; }; }
lacks() { ! grep -q -- "$2" "$1" || { FAIL "$1 has '$2'"; echo "--- $1"; cat "$1"; }; }
PORT=29610
RELAX=(--max-latency-ms 50 --min-bandwidth-gbps 0.01 --stream-mib 8 --all-reduce-mib 2 --min-shm 64MiB
       --join-timeout 5 --cluster-token doctor-token)

# run TAG [--b PREFIX...] [--] [extra flags for both]; B's command may be wrapped (env, unshare).
# Sets HEAD_RC, NODE_RC, and leaves $TMP/TAG.head / $TMP/TAG.node.
run() {
  local tag="$1"; shift
  local bwrap=() bflags=() aflags=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --bwrap) bwrap+=("$2"); shift 2 ;;
      --bflag) bflags+=("$2"); shift 2 ;;
      --model-b) MB="$2"; shift 2 ;;
      *) aflags+=("$1"); shift ;;
    esac
  done
  PORT=$((PORT + 1))
  local common=(doctor --nnodes 2 --master-addr 10.79.0.1 --master-port $PORT "${RELAX[@]}" "${aflags[@]}")
  local start=$(date +%s.%N)
  ip netns exec "$A" timeout 60 "$BIN" "${common[@]}" "$TMP/mA" --node-rank 0 >"$TMP/$tag.head" 2>&1 &
  local h=$!
  ip netns exec "$B" timeout 60 "${bwrap[@]}" "$BIN" "${common[@]}" "${MB:-$TMP/mB}" --node-rank 1 "${bflags[@]}" \
    >"$TMP/$tag.node" 2>&1 &
  local n=$!
  wait $h; HEAD_RC=$?
  wait $n; NODE_RC=$?
  MB=""
  echo "$tag: head exit $HEAD_RC, node exit $NODE_RC, $(python3 -c "import sys,time; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$start") s"
}

# 1. healthy
run healthy
[ "$HEAD_RC" = 0 ] || FAIL "healthy: head exit $HEAD_RC"
[ "$NODE_RC" = 0 ] || FAIL "healthy: node exit $NODE_RC"
lacks "$TMP/healthy.head" "✗"
has "$TMP/healthy.head" "✓ tessera version"
has "$TMP/healthy.head" "✓ MTU .*1500 on every chosen NIC"
has "$TMP/healthy.head" "✓ model files .*identical on every node"
has "$TMP/healthy.head" "node 0 (10.79.0.1) -> node 1 (10.79.0.2) latency"
has "$TMP/healthy.head" "node 1 (10.79.0.2) -> node 0 (10.79.0.1) TCP stream"
has "$TMP/healthy.head" "✓ all-reduce (Gloo)"
has "$TMP/healthy.head" "link for tessera plan .*--link [0-9.]*,[0-9]* (the slowest pair"
has "$TMP/healthy.head" "✓ NIC choice .*ens1 (10.79.0.1)"
has "$TMP/healthy.head" "✓ /dev/shm"
has "$TMP/healthy.node" "every check passed"

# 2. blocked ports on B: new connections to B are dropped (the control port is on A)
ip netns exec "$B" nft -f - <<'NFT'
table inet tdoc {
  chain input {
    type filter hook input priority 0; policy accept;
    ct state established,related accept
    tcp flags syn drop
  }
}
NFT
run blocked
ip netns exec "$B" nft delete table inet tdoc
[ "$HEAD_RC" = 1 ] || FAIL "blocked: head exit $HEAD_RC"
[ "$NODE_RC" = 1 ] || FAIL "blocked: node exit $NODE_RC"
has "$TMP/blocked.head" "✗ node 0 (10.79.0.1) -> node 1 (10.79.0.2) port"
has "$TMP/blocked.head" "fix: open TCP between the nodes on ens1"
has "$TMP/blocked.head" "✗ all-reduce (Gloo) .*skipped"
lacks "$TMP/blocked.head" "✗ node 1 (10.79.0.2) -> node 0"

# 3. MTU mismatch
ip -n "$B" link set ens1 mtu 1400
run mtu
ip -n "$B" link set ens1 mtu 1500
[ "$HEAD_RC" = 1 ] || FAIL "mtu: head exit $HEAD_RC"
has "$TMP/mtu.head" "✗ MTU .*node 0 (10.79.0.1) ens1 1500, node 1 (10.79.0.2) ens1 1400"
has "$TMP/mtu.head" "fix: set one MTU on every node"

# 4. a decoy NIC on B: it does not route to the head, and the head is not reachable from it
run nic --bflag --nic --bflag =eno9
[ "$HEAD_RC" = 1 ] || FAIL "nic: head exit $HEAD_RC"
[ "$NODE_RC" = 1 ] || FAIL "nic: node exit $NODE_RC"
has "$TMP/nic.node" "✗ NIC choice .*eno9 (192.168.52.2), but the kernel routes to the head through ens1"
has "$TMP/nic.node" "fix: use --nic =ens1"
has "$TMP/nic.node" "✗ control port 10.79.0.1:"
has "$TMP/nic.head" "✗ control port"

# 5. a small /dev/shm on B (a private mount namespace)
run shm --bwrap unshare --bwrap -m --bwrap sh --bwrap -c \
  --bwrap 'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$0" "$@"'
[ "$HEAD_RC" = 1 ] || FAIL "shm: head exit $HEAD_RC"
has "$TMP/shm.head" "✗ /dev/shm .*0.01 GiB"
has "$TMP/shm.head" "fix: give the container more shared memory (docker run --shm-size=16g"
[ "$(grep -c "✗ /dev/shm" "$TMP/shm.head")" = 1 ] || FAIL "shm: node 0's /dev/shm must pass, node 1's fail"

# 6. model files: one byte of B's tensor data changed (the last byte of the file)
python3 - "$TMP/mB/model.safetensors" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(-1, 2); b = f.read(1); f.seek(-1, 2); f.write(bytes([b[0] ^ 0x5a]))
PY
run files_headers
[ "$HEAD_RC" = 0 ] || FAIL "files_headers: the headers are equal, head exit $HEAD_RC"
has "$TMP/files_headers.head" "--verify-weights also hashes the tensor data"
run files --verify-weights
[ "$HEAD_RC" = 1 ] || FAIL "files: head exit $HEAD_RC"
has "$TMP/files.head" "✗ model files .*node 1 (10.79.0.2): model.safetensors has the same header but different tensor data"
has "$TMP/files.head" "fix: copy the head's model directory"
cp "$TMP/mA/model.safetensors" "$TMP/mB/model.safetensors"

# 7. another version on B
run version --bwrap env --bwrap TESSERA_DOCTOR_FAKE_VERSION=0.0.1-other
[ "$HEAD_RC" = 1 ] || FAIL "version: head exit $HEAD_RC"
has "$TMP/version.head" "✗ tessera version .*node 1 (10.79.0.2) has 0.0.1-other"
has "$TMP/version.head" "fix: install the same tessera build"

if [ -n "${SHOW:-}" ]; then for f in "$TMP"/*.head "$TMP"/*.node; do echo "=== $f"; cat "$f"; done; fi
[ $fail = 0 ] && echo "PASS: netns doctor"
exit $fail
