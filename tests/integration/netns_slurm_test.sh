#!/usr/bin/env bash
# tessera under a real Slurm (Debian's slurm-wlm + munge): slurmctld and one slurmd per host
# on two network namespaces (netns_slurm.sh), CPU ranks of the demo model, the commands of
# docs/distributed.md ("Slurm"). Checks:
#   1. srun, one task per node, `generate` TP=2: the greedy tokens of one rank; node 1 took its
#      facts from Slurm and found the master in the compressed node list tnode[10,20].
#   2. sbatch, one task per node, `serve` TP=2: /health on rank 0, a completion equal to one
#      rank's, then scancel: the head drains ("Shutdown complete."), node 1's ranks finish, the
#      job leaves the queue.
#   3. sbatch, one task per rank (two per node), `serve` TP=2 x PP=2: /health, the same text,
#      then a rank on node 1 is killed: the head exits non-zero naming it within 30 s.
#   4. The batch-shell trap: `srun bash -c "... --node-rank $SLURM_NODEID"` gives every node
#      rank 0; node 1 refuses to start, naming both sides.
#   5. mpirun inside an sbatch allocation (Open MPI starts its daemons with srun, so the
#      processes carry Slurm's variables too): Open MPI's ranks are used, one rank's tokens.
#   netns_slurm_test.sh TESSERA_BIN     (root; exit 77 = skipped)
set -uo pipefail
BIN="$(readlink -f "${1:?usage: netns_slurm_test.sh TESSERA_BIN}")"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODEL="$ROOT/models/tessera-demo"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
# shellcheck source=netns_hosts.sh
source "$HERE/netns_hosts.sh"
# shellcheck source=netns_slurm.sh
source "$HERE/netns_slurm.sh"
TMP=$(mktemp -d /tmp/tessera-netns-slurm.XXXXXX)
chmod 755 "$TMP"
netns_hosts_up tsl 10.79.0
trap 'slurm_down; netns_hosts_cleanup' EXIT
T_START=$(date +%s.%N)
slurm_up 10.79.0

# shellcheck source=launch_checks.sh
source "$HERE/launch_checks.sh"
export TESSERA_CLUSTER_TOKEN=netns-slurm-token

"$BIN" generate --model "$MODEL" "${GEN[@]}" >"$TMP/ref.jsonl" 2>"$TMP/ref.log" || { echo "FAIL: one-rank reference"; cat "$TMP/ref.log"; exit 1; }
REF="$(ids "$TMP/ref.jsonl")"
REF_TEXT="$(text "$TMP/ref.jsonl")"

# wait_http LOG: the port rank 0 serves on, once it does (60 s at most), else empty.
wait_http() {
  local port=""
  for _ in $(seq 1 600); do
    port="$(sed -n 's/.*Starting tessera API server on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$1" 2>/dev/null | head -1)"
    [ -n "$port" ] && break
    sleep 0.1
  done
  echo "$port"
}
# check_serving TAG LOG: /health and one completion against rank 0 on host A.
check_serving() {
  local tag="$1" port
  port="$(wait_http "$2")"
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
# pid_of NS PROCID: the tessera task with that SLURM_PROCID in namespace NS (not a spawned rank).
pid_of() {
  local p
  for p in $(ip netns pids "$1"); do
    [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$BIN" ] || continue
    grep -qa -- "--worker-rank" "/proc/$p/cmdline" && continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_PROCID=$2" && { echo "$p"; return; }
  done
}
# wait_job_gone JOBID SECONDS: 0 once the job left the queue.
wait_job_gone() {
  for _ in $(seq 1 $(($2 * 10))); do
    [ -z "$(on_a squeue -h -j "$1" -o %i 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  return 1
}
submit() {  # submit SCRIPT: prints the job id
  on_a sbatch --parsable --chdir="$TMP" "$1"
}

# --- 1. srun, one task per node, generate TP=2
T0=$(date +%s.%N)
on_a srun -N2 --ntasks-per-node=1 --gpus-per-node=1 --chdir="$TMP" --output="$TMP/s1.%t.log" \
  "$BIN" generate --model "$MODEL" "${GEN[@]}" --tensor-parallel-size 2
RC=$?
T1=$(date +%s.%N)
[ $RC = 0 ] || FAIL "srun generate exited $RC"
GOT="$(ids "$TMP/s1.0.log")"
[ "$GOT" = "$REF" ] || FAIL "srun TP=2: tokens differ from one rank: want $REF got $GOT"
has "$TMP/s1.1.log" "launch from Slurm: node 1 of 2, rank 1 of 2 (local 0 of 1), one process per node, master tnode10:29500 (from the first node of SLURM_STEP_NODELIST=tnode\[10,20\])"
has "$TMP/s1.0.log" "this node runs ranks 0..0 on 10.79.0.1"
echo "1. srun generate TP=2, one task per node: tokens = one rank ($(elapsed "$T0" "$T1") s)"

# --- 2. sbatch, one task per node, serve TP=2, then scancel
cat >"$TMP/serve_tp2.sbatch" <<EOF
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=1
#SBATCH --output=$TMP/s2.batch.log
export TESSERA_CLUSTER_TOKEN=\$(openssl rand -hex 32)
srun --output=$TMP/s2.%t.log $BIN serve $MODEL --device cpu --tensor-parallel-size 2 --host 0.0.0.0 --port 8000
EOF
T0=$(date +%s.%N)
JOB=$(submit "$TMP/serve_tp2.sbatch")
check_serving s2 "$TMP/s2.0.log"
T1=$(date +%s.%N)
on_a scancel "$JOB"
wait_job_gone "$JOB" 40 || FAIL "sbatch serve: the job was still queued 40 s after scancel"
T2=$(date +%s.%N)
has "$TMP/s2.0.log" "Received SIGTERM; shutting down"
has "$TMP/s2.0.log" "Shutdown complete."
has "$TMP/s2.1.log" "node 1: SIGTERM: waiting for the head's shutdown"
has "$TMP/s2.1.log" "node 1: every rank finished"
# (slurmstepd adds its own "error: *** STEP ... CANCELLED" line to the tasks' output)
ERRS="$(grep -h "error:" "$TMP/s2.0.log" "$TMP/s2.1.log" | grep -v "^slurmstepd")"
[ -z "$ERRS" ] || FAIL "sbatch serve: an error after scancel: $ERRS"
echo "2. sbatch serve TP=2: /health and text on rank 0 after $(elapsed "$T0" "$T1") s; scancel drained, job gone in $(elapsed "$T1" "$T2") s"

# --- 3. sbatch, one task per rank, serve TP=2 x PP=2, then a killed rank on node 1
cat >"$TMP/serve_tp2pp2.sbatch" <<EOF
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH --output=$TMP/s3.batch.log
export TESSERA_CLUSTER_TOKEN=\$(openssl rand -hex 32)
srun --output=$TMP/s3.%t.log $BIN serve $MODEL --device cpu --tensor-parallel-size 2 --pipeline-parallel-size 2 --host 0.0.0.0 --port 8000
EOF
T0=$(date +%s.%N)
JOB=$(submit "$TMP/serve_tp2pp2.sbatch")
check_serving s3 "$TMP/s3.0.log"
T1=$(date +%s.%N)
has "$TMP/s3.3.log" "rank 3 of 4 (local 1 of 2), one process per rank"
has "$TMP/s3.0.log" "this node runs ranks 0..1 on 10.79.0.1"
HEAD_PID="$(pid_of "$A" 0)"
VICTIM="$(pid_of "$B" 3)"
if [ -z "$HEAD_PID" ] || [ -z "$VICTIM" ]; then FAIL "sbatch TP=2 x PP=2: no task 0 in A ($HEAD_PID) or task 3 in B ($VICTIM)"; else
  T1=$(date +%s.%N)
  kill -9 "$VICTIM"
  for _ in $(seq 1 300); do kill -0 "$HEAD_PID" 2>/dev/null || break; sleep 0.1; done
  T2=$(date +%s.%N)
  kill -0 "$HEAD_PID" 2>/dev/null && FAIL "the head still runs 30 s after rank 3 was killed"
  grep -q "error: .*rank 3" "$TMP/s3.0.log" || FAIL "the head's error does not name rank 3: $(grep 'error' "$TMP/s3.0.log" | tail -2)"
  grep "error: " "$TMP/s3.0.log" | head -1
  echo "3. sbatch serve TP=2 x PP=2, one task per rank: /health and text after $(elapsed "$T0" "$T1") s; the head named killed rank 3 and exited in $(elapsed "$T1" "$T2") s"
fi
wait_job_gone "$JOB" 20 || { on_a scancel "$JOB"; FAIL "the job of the killed rank was still queued 20 s later"; }

# --- 4. the batch shell expands $SLURM_NODEID once: every node gets --node-rank 0
cat >"$TMP/same_rank.sbatch" <<EOF
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=$TMP/s4.batch.log
srun --kill-on-bad-exit=1 --output=$TMP/s4.%t.log bash -c "$BIN generate --model $MODEL ${GEN[*]} --tensor-parallel-size 2 --node-rank \$SLURM_NODEID"
EOF
T0=$(date +%s.%N)
JOB=$(submit "$TMP/same_rank.sbatch")
wait_job_gone "$JOB" 30 || { on_a scancel "$JOB"; FAIL "the same-rank job did not end within 30 s"; }
T1=$(date +%s.%N)
has "$TMP/s4.1.log" "--node-rank 0 contradicts SLURM_NODEID=1 (from the launcher's environment)"
has "$TMP/s4.1.log" "expands it once in the batch shell and gives every node the same rank"
echo "4. every node given --node-rank 0 by the batch shell: refused in $(elapsed "$T0" "$T1") s"

# --- 5. mpirun inside the allocation: Open MPI starts its daemons with srun, so its processes
# also carry Slurm's variables (those of a daemon's step); Open MPI's ranks must win.
if command -v mpirun >/dev/null; then
  cat >"$TMP/mpirun.sbatch" <<EOF
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=$TMP/s5.batch.log
mpirun --allow-run-as-root --map-by ppr:1:node --mca oob_tcp_if_include ens1 \\
  -x MASTER_ADDR=\$(scontrol show hostnames "\$SLURM_JOB_NODELIST" | head -1) \\
  -x TESSERA_CLUSTER_TOKEN sh -c 'exec "\$0" "\$@" >$TMP/s5.\$OMPI_COMM_WORLD_RANK.log 2>&1' \\
  $BIN generate --model $MODEL ${GEN[*]} --tensor-parallel-size 2
EOF
  T0=$(date +%s.%N)
  JOB=$(submit "$TMP/mpirun.sbatch")
  wait_job_gone "$JOB" 60 || { on_a scancel "$JOB"; FAIL "the mpirun job did not end within 60 s"; }
  T1=$(date +%s.%N)
  GOT="$(ids "$TMP/s5.0.log")"
  [ "$GOT" = "$REF" ] || { FAIL "mpirun inside the allocation: tokens differ: want $REF got $GOT"; tail -n 5 "$TMP"/s5.*; }
  has "$TMP/s5.1.log" "launch from Open MPI: node 1 of 2, rank 1 of 2"
  has "$TMP/s5.1.log" "Slurm's variables are set too and ignored: Open MPI comes first"
  echo "5. mpirun inside an sbatch allocation: Open MPI's ranks used, tokens = one rank ($(elapsed "$T0" "$T1") s)"
fi

echo "total $(elapsed "$T_START" "$(date +%s.%N)") s"
[ $fail = 0 ] && echo "PASS: tessera under Slurm (srun, sbatch, scancel) across two namespaces"
exit $fail
