#!/usr/bin/env bash
# scripts/deploy_cluster.sh against two "hosts" that run a real sshd (Debian openssh-server):
# network namespaces A (10.81.0.1) and B (10.81.0.2) joined by a veth pair, an sshd on port
# 2222 in each with a throwaway host key and authorized key. From A (the admin machine and
# the head) the script cleans up, starts the head and the worker over ssh, waits for both to
# join, serves the fixture with TP=2 across them, checks /health, sends one chat request and
# prints the endpoint; a second run replaces the first cleanly; `--stop` ends everything.
#   netns_deploy_test.sh TESSERA_BIN
# Exit 77 (ctest SKIP) when not root, or without ip/sshd/ssh/curl.
set -uo pipefail
BIN=$(realpath "${1:?usage: netns_deploy_test.sh TESSERA_BIN}")  # the remote shells start in ~
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOK="$ROOT/.npm-pkgs/tokenizer-qwen3/package/models"
SSHD=/usr/sbin/sshd
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
for c in ip ssh ssh-keygen curl; do command -v $c >/dev/null || { echo "SKIP: no $c"; exit 77; }; done
[ -x $SSHD ] || { echo "SKIP: no $SSHD (apt-get install openssh-server)"; exit 77; }
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: $TOK/tokenizer.json missing (scripts/fetch_test_data.sh)"; exit 77; }

TMP=$(mktemp -d /tmp/tessera-netns-deploy.XXXXXX)
chmod 755 "$TMP"
source "$(dirname "$0")/netns_hosts.sh"
MODEL="$TMP/model"
tiny_chat_model "$MODEL"
netns_hosts_up tsd 10.81.0
set -e
ssh-keygen -q -t ed25519 -N "" -f "$TMP/id" >/dev/null
ssh-keygen -q -t ed25519 -N "" -f "$TMP/hostkey" >/dev/null
cp "$TMP/id.pub" "$TMP/authorized_keys"
chmod 600 "$TMP/authorized_keys"
mkdir -p /run/sshd
for i in 1 2; do
  ns=$([ $i = 1 ] && echo "$A" || echo "$B")
  cat >"$TMP/sshd_$i.conf" <<CONF
Port 2222
ListenAddress 10.81.0.$i
HostKey $TMP/hostkey
AuthorizedKeysFile $TMP/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PidFile $TMP/sshd_$i.pid
CONF
  ip netns exec "$ns" $SSHD -D -e -f "$TMP/sshd_$i.conf" 2>"$TMP/sshd_$i.log" &
done
set +e
for i in 1 2; do
  for _ in $(seq 1 50); do grep -q "Server listening" "$TMP/sshd_$i.log" && break; sleep 0.1; done
done

fail=0
FAIL() { echo "FAIL: $*"; fail=1; }
DEPLOY=("$ROOT/scripts/deploy_cluster.sh" --head root@10.81.0.1 --worker root@10.81.0.2 --model "$MODEL"
        --tessera "$BIN" --state-dir "$TMP/state" --timeout 60
        --ssh-opt -i --ssh-opt "$TMP/id" --ssh-opt -p --ssh-opt 2222
        --ssh-opt -oStrictHostKeyChecking=no --ssh-opt -oUserKnownHostsFile=/dev/null --ssh-opt -oLogLevel=ERROR)
export TESSERA_CLUSTER_TOKEN=netns-deploy-token
for run in 1 2; do
  T0=$(date +%s)
  ip netns exec "$A" "${DEPLOY[@]}" -- --tensor-parallel-size 2 --max-model-len 512 \
    --load-format dummy --num-gpu-blocks-override 256 >"$TMP/deploy$run.log" 2>&1
  rc=$?
  cat "$TMP/deploy$run.log"
  [ $rc = 0 ] || FAIL "deploy run $run exited $rc"
  grep -q "all 2 node(s) joined" "$TMP/deploy$run.log" || FAIL "run $run: no join check"
  grep -q "health check: http://10.81.0.1:8000/health answers 200" "$TMP/deploy$run.log" || FAIL "run $run: no health check"
  grep -q "smoke test reply:" "$TMP/deploy$run.log" || FAIL "run $run: no smoke test"
  grep -q "endpoint: http://10.81.0.1:8000/v1" "$TMP/deploy$run.log" || FAIL "run $run: no endpoint"
  grep -q "crosses the network link" "$TMP/state/10.81.0.1/serve.log" || FAIL "run $run: serve did not run TP across the nodes"
  echo "deploy run $run: $(( $(date +%s) - T0 )) s"
done
# The second run replaced the first: one head, one worker, one server.
procs() { local p; p=$( (for ns in "$@"; do ip netns pids "$ns"; done) | paste -sd,); [ -n "$p" ] && ps -o args= -p "$p"; }
n=$(procs "$A" | grep -c "node start --head")
[ "$n" = 1 ] || FAIL "$n heads after two runs"
ip netns exec "$A" "${DEPLOY[@]}" --stop >"$TMP/stop.log" 2>&1 || FAIL "--stop exited $?"
sleep 0.5
left=$(procs "$A" "$B" | grep -c "$BIN")
[ "$left" = 0 ] || FAIL "$left tessera processes left after --stop"
[ $fail = 0 ] && echo "PASS: deploy_cluster.sh over ssh into two namespaces"
exit $fail
