#!/usr/bin/env bash
# Brings up a tessera cluster from one machine over ssh, the way the seeds deploy Ray + vLLM
# ("一键部署脚本，包含清理、启动、校验、健康检查全流程"): clean up what an earlier run of this
# script started, start the head (`tessera node start --head`) and the workers (`tessera node
# start --address`), wait until every node has joined, start `tessera serve` on the head with
# `--distributed-executor-backend ray`, wait for /health, send one chat request, print the
# endpoint. Every wait has a limit; any failure prints the remote log tail and exits non-zero.
#
#   scripts/deploy_cluster.sh --head root@10.0.0.1 --worker root@10.0.0.2 [--worker ...] \
#       --model /models/Qwen3-8B [--tessera /opt/tessera/tessera] [--port 6379] [--http-port 8000] \
#       [--node-ip HOST=IP ...] [--ssh-opt OPT ...] [--state-dir DIR] [--timeout S] -- SERVE_FLAGS...
#   scripts/deploy_cluster.sh --head ... --worker ... --stop      (the cleanup step alone)
#
# The head's and workers' addresses on the cluster network are the hosts' names in --head /
# --worker (or --node-ip HOST=IP when ssh goes over another network). The cluster token is
# $TESSERA_CLUSTER_TOKEN, else a fresh random one; it travels in the environment of the remote
# commands, never on a tessera command line. The model path must be the same on every node.
set -euo pipefail

HEAD="" WORKERS=() MODEL="" TESSERA=tessera PORT=6379 HTTP_PORT=8000 SSH_OPTS=() STATE_DIR=/tmp/tessera-deploy
TIMEOUT=300 STOP=0 SERVE_ARGS=()
declare -A NODE_IP=()
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --head) HEAD="$2"; shift 2 ;;
    --worker) WORKERS+=("$2"); shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --tessera) TESSERA="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --http-port) HTTP_PORT="$2"; shift 2 ;;
    --node-ip) NODE_IP["${2%%=*}"]="${2#*=}"; shift 2 ;;
    --ssh-opt) SSH_OPTS+=("$2"); shift 2 ;;
    --state-dir) STATE_DIR="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --stop) STOP=1; shift ;;
    --) shift; SERVE_ARGS=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "deploy_cluster.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$HEAD" ] || { echo "deploy_cluster.sh: --head USER@HOST is required" >&2; exit 2; }
[ $STOP = 1 ] || [ -n "$MODEL" ] || { echo "deploy_cluster.sh: --model DIR is required" >&2; exit 2; }
TOKEN="${TESSERA_CLUSTER_TOKEN:-$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')}"

host_of() { local h="${1#*@}"; echo "${NODE_IP[$h]:-$h}"; }
HEAD_IP="$(host_of "$HEAD")"
log() { echo "[deploy $(date +%H:%M:%S)] $*"; }
q() { printf '%q ' "$@"; }
# Each host's pid files and logs: STATE_DIR/HOST on that host (its own directory even when
# hosts share a file system). The head's cluster state file lands there too.
sdir() { echo "$STATE_DIR/${1#*@}"; }
# One ssh connection per host, reused by every command (ControlMaster), closed at exit.
CTL="$(mktemp -d /tmp/deploy_cluster.XXXXXX)"
close_connections() {
  for h in "$HEAD" "${WORKERS[@]}"; do ssh -o ControlPath="$CTL/%C" -O exit "$h" >/dev/null 2>&1 || true; done
  rm -rf "$CTL"
}
trap close_connections EXIT
# remote HOST CMD: runs CMD through the remote shell with the cluster's environment; $D is
# the host's state directory there.
remote() {
  local host="$1"; shift
  ssh -o BatchMode=yes -o ConnectTimeout=10 -o ControlMaster=auto -o ControlPath="$CTL/%C" -o ControlPersist=60 \
    "${SSH_OPTS[@]}" "$host" \
    "export TESSERA_CLUSTER_TOKEN=$(q "$TOKEN") TESSERA_STATE_DIR=$(q "$(sdir "$host")") D=$(q "$(sdir "$host")");
     mkdir -p \"\$D\"; $*"
}
die() {
  echo "deploy_cluster.sh: $*" >&2
  for h in "$HEAD" "${WORKERS[@]}"; do
    echo "--- $h: $(sdir "$h")/*.log" >&2
    remote "$h" 'tail -n 15 "$D"/*.log 2>/dev/null' >&2 || true
  done
  exit 1
}
# start_bg HOST NAME CMD...: CMD in the background on HOST, its pid in STATE_DIR/NAME.pid.
start_bg() {
  local host="$1" name="$2"; shift 2
  remote "$host" "nohup $(q "$@") >\"\$D/$name.log\" 2>&1 </dev/null & echo \$! >\"\$D/$name.pid\""
}

# 1. cleanup: what an earlier run started (by its pid files), never anything else
for h in "$HEAD" "${WORKERS[@]}"; do
  remote "$h" 'for f in "$D"/serve.pid "$D"/node.pid; do
      [ -f "$f" ] || continue; p=$(cat "$f"); kill "$p" 2>/dev/null || true
      for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$p" 2>/dev/null || true; rm -f "$f"; done; rm -f "$D"/*.log' ||
    die "cannot reach $h over ssh"
  log "cleaned up $h"
done
[ $STOP = 1 ] && { log "stopped"; exit 0; }

# 2. start: the head, then the workers
start_bg "$HEAD" node "$TESSERA" node start --head --port "$PORT" --node-ip-address "$HEAD_IP"
for _ in $(seq 1 $((TIMEOUT * 5))); do
  remote "$HEAD" 'grep -q "cluster head started" "$D"/node.log' && break
  remote "$HEAD" 'kill -0 $(cat "$D"/node.pid) 2>/dev/null' || die "the head exited"
  sleep 0.2
done
log "head started at $HEAD_IP:$PORT"
for w in "${WORKERS[@]}"; do
  start_bg "$w" node "$TESSERA" node start --address "$HEAD_IP:$PORT" --node-ip-address "$(host_of "$w")"
done

# 3. check: every node joined and alive
want=$((1 + ${#WORKERS[@]}))
deadline=$((SECONDS + TIMEOUT))
until remote "$HEAD" "$(q "$TESSERA") cluster status" >/tmp/deploy_status.$$ 2>&1 &&
      grep -q "$want node(s) alive of $want joined" /tmp/deploy_status.$$; do
  [ $SECONDS -lt $deadline ] || { cat /tmp/deploy_status.$$ >&2; rm -f /tmp/deploy_status.$$; die "not every node joined within $TIMEOUT s"; }
  sleep 0.5
done
cat /tmp/deploy_status.$$; rm -f /tmp/deploy_status.$$
log "all $want node(s) joined"

# 4. serve on the head, then the health check
start_bg "$HEAD" serve "$TESSERA" serve "$MODEL" --host 0.0.0.0 --port "$HTTP_PORT" \
  --distributed-executor-backend ray "${SERVE_ARGS[@]}"
deadline=$((SECONDS + TIMEOUT))
until remote "$HEAD" "curl -fsS -m 5 http://127.0.0.1:$HTTP_PORT/health" >/dev/null 2>&1; do
  remote "$HEAD" 'kill -0 $(cat "$D"/serve.pid) 2>/dev/null' || die "tessera serve exited"
  [ $SECONDS -lt $deadline ] || die "/health did not answer 200 within $TIMEOUT s"
  sleep 0.5
done
log "health check: http://$HEAD_IP:$HTTP_PORT/health answers 200"

# 5. smoke test: one chat request, from this machine
NAME="$(curl -fsS -m 10 "http://$HEAD_IP:$HTTP_PORT/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')" ||
  die "GET /v1/models failed from this machine (is port $HTTP_PORT reachable?)"
REPLY="$(curl -sS -m 120 "http://$HEAD_IP:$HTTP_PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$NAME"),\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8}")" ||
  die "the smoke-test chat request got no answer"
python3 -c 'import json,sys; print("smoke test reply:", json.dumps(json.loads(sys.argv[1])["choices"][0]["message"].get("content"))[:200])' "$REPLY" ||
  die "the smoke-test reply is not a chat completion: $REPLY"
echo "endpoint: http://$HEAD_IP:$HTTP_PORT/v1  (model $NAME)"
