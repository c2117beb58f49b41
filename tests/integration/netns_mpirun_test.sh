#!/usr/bin/env bash
# tessera under a real Open MPI mpirun (Debian's openmpi-bin) across two network namespaces:
# mpirun runs on host A (tnodeA) and reaches host B (tnodeB) through netns_rsh_agent.sh, its
# remote shell (--mca plm_rsh_agent); CPU ranks of the demo model; the commands of
# docs/distributed.md ("Open MPI"). Checks:
#   1. one process per node (-np 2), `serve` TP=2 x PP=2 (tessera starts two ranks per node):
#      /health on rank 0, a completion equal to one rank's; SIGTERM to mpirun: the head drains
#      ("Shutdown complete."), node 1's ranks finish, mpirun exits.
#   2. one process per rank (-np 4, two per node), `generate` TP=2 x PP=2: one rank's tokens.
#   3. one process per node, `serve` TP=2, then node 1's rank is killed: the head exits non-zero
#      naming it within 30 s.
#   netns_mpirun_test.sh TESSERA_BIN     (root; exit 77 = skipped)
set -uo pipefail
BIN="$(readlink -f "${1:?usage: netns_mpirun_test.sh TESSERA_BIN}")"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODEL="$ROOT/models/tessera-demo"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
command -v mpirun >/dev/null || { echo "SKIP: no mpirun (apt-get install openmpi-bin)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
# shellcheck source=netns_hosts.sh
source "$HERE/netns_hosts.sh"
TMP=$(mktemp -d /tmp/tessera-netns-mpirun.XXXXXX)
chmod 755 "$TMP"
netns_hosts_up tmp 10.80.0
trap 'rm -rf "/etc/netns/$A" "/etc/netns/$B"; netns_hosts_cleanup' EXIT
for ns in "$A" "$B"; do  # `ip netns exec` puts /etc/netns/NS/hosts over /etc/hosts
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n10.80.0.1 tnodeA\n10.80.0.2 tnodeB\n' >"/etc/netns/$ns/hosts"
done
export NETNS_RSH_MAP="tnodeA=$A,tnodeB=$B"
T_START=$(date +%s.%N)

# shellcheck source=launch_checks.sh
source "$HERE/launch_checks.sh"
"$BIN" generate --model "$MODEL" "${GEN[@]}" >"$TMP/ref.jsonl" 2>"$TMP/ref.log" || { echo "FAIL: one-rank reference"; cat "$TMP/ref.log"; exit 1; }
REF="$(ids "$TMP/ref.jsonl")"
REF_TEXT="$(text "$TMP/ref.jsonl")"

# mpi TAG NP MPIRUN_FLAGS... -- TESSERA_ARGS...: mpirun on host A in the background ($MPI_PID);
# process r writes $TMP/TAG.r.log.
mpi() {
  local tag="$1" np="$2"; shift 2
  local flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  ip netns exec "$A" unshare --uts sh -c 'hostname tnodeA && exec "$@"' sh \
    mpirun --allow-run-as-root -np "$np" --host tnodeA:2,tnodeB:2 "${flags[@]}" \
    --mca plm_rsh_agent "$HERE/netns_rsh_agent.sh" --mca oob_tcp_if_include ens1 \
    -x MASTER_ADDR=tnodeA -x TESSERA_CLUSTER_TOKEN=netns-mpirun-token \
    sh -c 'exec "$0" "$@" >'"$TMP/$tag"'.$OMPI_COMM_WORLD_RANK.log 2>&1' "$BIN" "$@" >"$TMP/$tag.mpirun.log" 2>&1 &
  MPI_PID=$!
}
wait_http() {
  local port=""
  for _ in $(seq 1 600); do
    port="$(sed -n 's/.*Starting tessera API server on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$1" 2>/dev/null | head -1)"
    [ -n "$port" ] && break
    kill -0 "$MPI_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "$port"
}
check_serving() {  # check_serving TAG: /health and one completion against rank 0 on host A
  local tag="$1" port
  port="$(wait_http "$TMP/$tag.0.log")"
  if [ -z "$port" ]; then FAIL "$tag: rank 0 did not serve within 60 s"; tail -20 "$TMP/$tag".*.log; return 1; fi
  [ "$(ip netns exec "$A" curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] ||
    FAIL "$tag: /health on rank 0 is not 200"
  ip netns exec "$A" curl -sS -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/completions" \
    -d "{\"prompt\":[$PROMPT],\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}" >"$TMP/$tag.http.json"
  python3 - "$TMP/$tag.http.json" "$REF_TEXT" <<'PY' || FAIL "$tag: served text differs from one rank's"
import json, sys
got = json.load(open(sys.argv[1]))["choices"][0]["text"]
assert got == sys.argv[2] and got, (got, sys.argv[2])
PY
}
wait_gone() {  # wait_gone PID SECONDS: 0 once PID has exited; MPI_RC holds its status
  for _ in $(seq 1 $(($2 * 10))); do
    if ! kill -0 "$1" 2>/dev/null; then wait "$1"; MPI_RC=$?; return 0; fi
    sleep 0.1
  done
  return 1
}

# --- 1. one process per node, serve TP=2 x PP=2, then SIGTERM to mpirun
T0=$(date +%s.%N)
mpi m1 2 --map-by ppr:1:node -- serve "$MODEL" --device cpu --tensor-parallel-size 2 --pipeline-parallel-size 2 \
  --host 0.0.0.0 --port 8000
check_serving m1
T1=$(date +%s.%N)
has "$TMP/m1.1.log" "launch from Open MPI: node 1 of 2, rank 1 of 2 (local 0 of 1), one process per node, master tnodeA:29500 (from MASTER_ADDR)"
has "$TMP/m1.1.log" "this node runs ranks 2..3 on 10.80.0.2"
kill -TERM "$MPI_PID"
wait_gone "$MPI_PID" 40 || FAIL "mpirun still runs 40 s after SIGTERM"
T2=$(date +%s.%N)
has "$TMP/m1.0.log" "Received SIGTERM; shutting down"
has "$TMP/m1.0.log" "Shutdown complete."
has "$TMP/m1.1.log" "node 1: every rank finished"
ERRS="$(grep -h "error:" "$TMP/m1.0.log" "$TMP/m1.1.log")"
[ -z "$ERRS" ] || FAIL "an error after SIGTERM: $ERRS"
echo "1. mpirun -np 2 serve TP=2 x PP=2: /health and text on rank 0 after $(elapsed "$T0" "$T1") s; SIGTERM drained, mpirun exited $MPI_RC in $(elapsed "$T1" "$T2") s"

# --- 2. one process per rank, generate TP=2 x PP=2
T0=$(date +%s.%N)
mpi m2 4 --map-by ppr:2:node -- generate --model "$MODEL" "${GEN[@]}" --tensor-parallel-size 2 --pipeline-parallel-size 2
wait_gone "$MPI_PID" 60 || FAIL "mpirun -np 4 generate still runs after 60 s"
T1=$(date +%s.%N)
[ "${MPI_RC:-1}" = 0 ] || { FAIL "mpirun -np 4 generate exited ${MPI_RC:-?}"; tail -5 "$TMP"/m2.*.log; }
GOT="$(ids "$TMP/m2.0.log")"
[ "$GOT" = "$REF" ] || FAIL "mpirun one process per rank: tokens differ from one rank: want $REF got $GOT"
has "$TMP/m2.3.log" "rank 3 of 4 (local 1 of 2), one process per rank"
echo "2. mpirun -np 4 generate TP=2 x PP=2, one process per rank: tokens = one rank ($(elapsed "$T0" "$T1") s)"

# --- 3. one process per node, serve TP=2, node 1's rank killed
T0=$(date +%s.%N)
mpi m3 2 --map-by ppr:1:node -- serve "$MODEL" --device cpu --tensor-parallel-size 2 --host 0.0.0.0 --port 8000
check_serving m3
VICTIM=""
for p in $(ip netns pids "$B"); do
  [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$BIN" ] && grep -qa -- "--worker-rank" "/proc/$p/cmdline" && VICTIM=$p
done
if [ -z "$VICTIM" ]; then FAIL "no rank process on host B"; else
  T1=$(date +%s.%N)
  kill -9 "$VICTIM"
  wait_gone "$MPI_PID" 30 || FAIL "mpirun still runs 30 s after rank 1 was killed"
  T2=$(date +%s.%N)
  grep -q "error: .*rank 1" "$TMP/m3.0.log" || FAIL "the head's error does not name rank 1: $(grep error "$TMP/m3.0.log" | tail -2)"
  grep -h "error: " "$TMP/m3.0.log" | head -1
  [ "${MPI_RC:-0}" != 0 ] || FAIL "mpirun exited 0 after a rank was killed"
  echo "3. mpirun serve TP=2: killed rank 1 named by the head; mpirun exited $MPI_RC $(elapsed "$T1" "$T2") s later"
fi

echo "total $(elapsed "$T_START" "$(date +%s.%N)") s"
[ $fail = 0 ] && echo "PASS: tessera under Open MPI's mpirun across two namespaces"
exit $fail
