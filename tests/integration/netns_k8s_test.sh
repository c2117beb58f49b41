#!/usr/bin/env bash
# The Kubernetes manifests of deploy/kubernetes/ without a cluster (no kubectl): render_pods.py
# renders the pods each one makes (the LeaderWorkerSet controller's LWS_* variables, the
# StatefulSet's pod-index label, the token from the Secret, the pod IP, $(VAR) in the command),
# then each pod's command runs with exactly that environment in a network namespace whose
# interface is eth0 (the pod network) and whose /etc/hosts resolves the pods' DNS names, CPU
# ranks of the demo model. Checks, per manifest: every pod takes its node rank and the leader's
# address from the rendered environment (the startup line names the source), VLLM_HOST_IP and
# NCCL_SOCKET_IFNAME are accepted, the leader's readiness probe passes (httpGet /health; the
# StatefulSet's exec probe on every pod), a completion equals one rank's, and SIGTERM to every
# pod (what deleting them does) drains: all exit 0.
#   netns_k8s_test.sh TESSERA_BIN     (root; exit 77 = skipped)
set -uo pipefail
BIN="$(readlink -f "${1:?usage: netns_k8s_test.sh TESSERA_BIN}")"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODEL="$ROOT/models/tessera-demo"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
python3 -c "import yaml" 2>/dev/null || { echo "SKIP: no PyYAML (apt-get install python3-yaml)"; exit 77; }
# shellcheck source=netns_hosts.sh
source "$HERE/netns_hosts.sh"
TMP=$(mktemp -d /tmp/tessera-netns-k8s.XXXXXX)
chmod 755 "$TMP"
netns_hosts_up tk8 10.81.0
trap 'rm -rf "/etc/netns/$A" "/etc/netns/$B"; netns_hosts_cleanup' EXIT
for ns in "$A" "$B"; do  # the pod network's interface is eth0
  ip -n "$ns" link set ens1 down && ip -n "$ns" link set ens1 name eth0 && ip -n "$ns" link set eth0 up || exit 1
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n10.81.0.1 tessera-0.tessera.default tessera-0.tessera-nodes\n10.81.0.2 tessera-0-1.tessera.default tessera-1.tessera-nodes\n' \
    >"/etc/netns/$ns/hosts"
done
T_START=$(date +%s.%N)

# shellcheck source=launch_checks.sh
source "$HERE/launch_checks.sh"
"$BIN" generate --model "$MODEL" --device cpu --json --ignore-eos --max-tokens 12 --prompt-ids "$PROMPT" \
  >"$TMP/ref.jsonl" 2>"$TMP/ref.log" || { echo "FAIL: one-rank reference"; cat "$TMP/ref.log"; exit 1; }
REF_TEXT="$(python3 -c 'import json, sys; print([json.loads(l)["text"] for l in open(sys.argv[1]) if l.startswith("{")][0])' "$TMP/ref.jsonl")"

# pod_field JSON INDEX EXPR: a Python expression over pod `p` of the rendered list.
pod_field() { python3 -c "import json, sys; p = json.load(open(sys.argv[1]))[int(sys.argv[2])]; print($3)" "$1" "$2"; }
# pod_exec JSON INDEX NS CMD...: CMD in namespace NS with exactly the pod's environment (and PATH).
pod_exec() {
  local json="$1" i="$2" ns="$3"; shift 3
  local envs=()
  mapfile -t envs < <(pod_field "$json" "$i" "'\n'.join(f'{k}={v}' for k, v in p['env'].items())")
  ip netns exec "$ns" env -i PATH="$PATH" HOME=/root "${envs[@]}" "$@"
}
# pod_start: pod_exec in the background whose $! is the process itself (ip netns exec and env exec it).
pod_start() {
  local json="$1" i="$2" ns="$3"; shift 3
  local envs=()
  mapfile -t envs < <(pod_field "$json" "$i" "'\n'.join(f'{k}={v}' for k, v in p['env'].items())")
  exec ip netns exec "$ns" env -i PATH="$PATH" HOME=/root "${envs[@]}" "$@"
}

run_manifest() {  # run_manifest TAG MANIFEST HEAD_POD NODE_POD
  local tag="$1" manifest="$2" json="$TMP/$1.pods.json" n i ns port
  python3 "$ROOT/deploy/kubernetes/render_pods.py" "$manifest" --pod-ip "$3=10.81.0.1" --pod-ip "$4=10.81.0.2" \
    >"$json" || { FAIL "$tag: render_pods.py failed"; return; }
  n="$(pod_field "$json" 0 "len(json.load(open(sys.argv[1])))")"
  [ "$n" = 2 ] || { FAIL "$tag: $n pods rendered, want 2"; return; }
  local pids=()
  local T0 T1 T2
  T0=$(date +%s.%N)
  for i in 0 1; do
    ns=$A; [ $i = 1 ] && ns=$B
    local argv=()
    # The container's command with the binary and model of this machine, on CPU ranks.
    mapfile -t argv < <(pod_field "$json" $i "'\n'.join(p['argv'][1:])" | sed "s|^/models/model\$|$MODEL|")
    pod_start "$json" $i "$ns" "$BIN" "${argv[@]}" --device cpu >"$TMP/$tag.$i.log" 2>&1 &
    pids+=($!)
  done
  port="$(pod_field "$json" 0 "p['ports'][0]")"
  local up=""
  for _ in $(seq 1 600); do
    grep -q "Application startup complete" "$TMP/$tag.0.log" && { up=1; break; }
    kill -0 "${pids[0]}" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$up" ] || { FAIL "$tag: the head did not serve within 60 s"; tail -n 20 "$TMP/$tag".[01].log; kill -9 "${pids[@]}"; return; }
  T1=$(date +%s.%N)
  # Readiness, as the kubelet would probe it.
  for i in 0 1; do
    ns=$A; [ $i = 1 ] && ns=$B
    local kind
    kind="$(pod_field "$json" $i "'none' if not p['readiness'] else ('http' if 'httpGet' in p['readiness'] else 'exec')")"
    if [ "$kind" = http ]; then
      local path pport
      path="$(pod_field "$json" $i "p['readiness']['httpGet']['path']")"
      pport="$(pod_field "$json" $i "p['readiness']['httpGet']['port']")"
      [ "$(ip netns exec "$ns" curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$pport$path")" = 200 ] ||
        FAIL "$tag: pod $i's readiness probe (httpGet $path on $pport) does not answer 200"
    elif [ "$kind" = exec ]; then
      local probe=()
      mapfile -t probe < <(pod_field "$json" $i "'\n'.join(p['readiness']['exec']['command'])")
      pod_exec "$json" $i "$ns" "${probe[@]}" >/dev/null || FAIL "$tag: pod $i's readiness probe (exec) fails"
    fi
  done
  ip netns exec "$A" curl -sS -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/completions" \
    -d "{\"prompt\":[$PROMPT],\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}" >"$TMP/$tag.http.json"
  python3 - "$TMP/$tag.http.json" "$REF_TEXT" <<'PY' || FAIL "$tag: served text differs from one rank's"
import json, sys
got = json.load(open(sys.argv[1]))["choices"][0]["text"]
assert got == sys.argv[2] and got, (got, sys.argv[2])
PY
  has "$TMP/$tag.1.log" "VLLM_HOST_IP=10.81.0.2 (from the environment) used as --node-ip-address"
  has "$TMP/$tag.1.log" "NCCL_SOCKET_IFNAME=eth0"
  has "$TMP/$tag.1.log" "node 1 of 2: NIC eth0 (10.81.0.2)"
  # Deleting the pods: SIGTERM to every container at once.
  kill -TERM "${pids[@]}"
  local rcs=()
  for p in "${pids[@]}"; do
    for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && { FAIL "$tag: a pod still runs 30 s after SIGTERM"; kill -9 "$p"; }
    wait "$p"; rcs+=($?)
  done
  T2=$(date +%s.%N)
  [ "${rcs[*]}" = "0 0" ] || FAIL "$tag: exit codes after SIGTERM: ${rcs[*]} (want 0 0)"
  has "$TMP/$tag.0.log" "Shutdown complete."
  echo "$tag: both pods up and the leader ready after $(elapsed "$T0" "$T1") s; SIGTERM drained in $(elapsed "$T1" "$T2") s"
}

run_manifest lws "$ROOT/deploy/kubernetes/leaderworkerset.yaml" tessera-0 tessera-0-1
has "$TMP/lws.0.log" "launch from LeaderWorkerSet: node 0 of 2, master tessera-0.tessera.default:29500 (from LWS_LEADER_ADDRESS)"
has "$TMP/lws.1.log" "launch from LeaderWorkerSet: node 1 of 2, master tessera-0.tessera.default:29500 (from LWS_LEADER_ADDRESS)"
run_manifest sts "$ROOT/deploy/kubernetes/statefulset.yaml" tessera-0 tessera-1
has "$TMP/sts.1.log" "launch from flags: node 1 of 2, master tessera-0.tessera-nodes:29500 (from --master-addr)"

echo "total $(elapsed "$T_START" "$(date +%s.%N)") s"
[ $fail = 0 ] && echo "PASS: the LeaderWorkerSet and StatefulSet manifests' pods, rendered and run in two namespaces"
exit $fail
