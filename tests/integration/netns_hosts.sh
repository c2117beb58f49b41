# Sourced by the namespace tests that play two hosts (netns_cluster_test.sh, netns_deploy_test.sh,
# netns_doctor_test.sh).
#   netns_hosts_up TAG SUBNET: namespaces $A and $B (named TAG_a_PID, TAG_b_PID) joined by a veth
#     pair named ens1 in each, SUBNET.1/24 in A and SUBNET.2/24 in B, lo up; a cleanup trap kills
#     their processes and $PIDS, deletes them and $TMP. Exits 77 (ctest SKIP) when namespaces
#     cannot be created here.
#   netns_hosts_decoys: docker0 and eno9 decoys on both hosts (below).
#   tiny_chat_model DIR: the seeds' model directory scaled down: configs/qwen3-tiny (2 layers,
#     hidden 64, the real Qwen3 vocabulary, so chat requests go through the real tokenizer and
#     template) with the tokenizer beside it; serve it with --load-format dummy (random weights).
PIDS=()
netns_hosts_cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns pids "$A" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$B" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; rm -rf "$TMP"
}
netns_hosts_up() {
  local tag="$1" subnet="$2"
  A=${tag}_a_$$
  B=${tag}_b_$$
  trap netns_hosts_cleanup EXIT
  if ! ip netns add "$A" 2>/dev/null; then echo "SKIP: ip netns add failed (no CAP_SYS_ADMIN?)"; exit 77; fi
  ip netns add "$B" || { echo "SKIP: second namespace failed"; exit 77; }
  ip link add ${tag}va$$ type veth peer name ${tag}vb$$ &&
    ip link set ${tag}va$$ netns "$A" && ip link set ${tag}vb$$ netns "$B" &&
    ip -n "$A" link set ${tag}va$$ name ens1 && ip -n "$B" link set ${tag}vb$$ name ens1 &&
    ip -n "$A" addr add "$subnet.1/24" dev ens1 && ip -n "$B" addr add "$subnet.2/24" dev ens1 || exit 1
  for ns in "$A" "$B"; do ip -n "$ns" link set lo up && ip -n "$ns" link set ens1 up || exit 1; done
}
# netns_hosts_decoys: on both hosts, a docker0 bridge (172.17.0.0/16) and a second NIC eno9
# (192.168.52.0/24) that do not route to the other host, for the NIC-choice checks.
netns_hosts_decoys() {
  local ns
  for ns in "$A" "$B"; do
    ip -n "$ns" link add docker0 type veth peer name eno9 && ip -n "$ns" link set docker0 up &&
      ip -n "$ns" link set eno9 up || exit 1
  done
  ip -n "$A" addr add 172.17.0.1/16 dev docker0 && ip -n "$B" addr add 172.17.0.2/16 dev docker0 &&
    ip -n "$A" addr add 192.168.52.1/24 dev eno9 && ip -n "$B" addr add 192.168.52.2/24 dev eno9 || exit 1
}
tiny_chat_model() {
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  mkdir -p "$1"
  cp "$root/configs/qwen3-tiny/config.json" "$root/.npm-pkgs/tokenizer-qwen3/package/models/tokenizer.json" \
    "$root/.npm-pkgs/tokenizer-qwen3/package/models/tokenizer_config.json" "$1"/
}
