# Sourced by netns_slurm_test.sh: a real Slurm cluster (Debian's slurm-wlm and munge) on the
# two namespace hosts of netns_hosts.sh. One munged (its socket under $TMP, reached from both
# namespaces through the file system), slurmctld on host A, one slurmd per host. The hosts are
# named $SLURM_NODE_A / $SLURM_NODE_B (each namespace gets its own /etc/hosts through
# /etc/netns/NAME/hosts, and each daemon its own host name through a UTS namespace), so the
# job's node list is Slurm's compressed form, e.g. tnode[10,20]. Two GPUs per node are declared
# by hand (gres.conf, /dev/null and /dev/zero standing in for the device files) so that jobs ask
# for them as on a GPU cluster (--gpus-per-node); the tasks run CPU ranks.
#   slurm_up SUBNET: writes $TMP/slurm/slurm.conf, starts the daemons, waits (30 s at most)
#     until both nodes are idle. Exits 77 (ctest SKIP) when slurm-wlm or munge is missing.
#   on_a CMD...: runs CMD on host A with SLURM_CONF set (srun, sbatch, squeue, scancel).
#   slurm_down: stops what slurm_up started (the test's EXIT trap calls it).
SLURM_NODE_A=tnode10
SLURM_NODE_B=tnode20
SLURM_PIDS=()
slurm_down() {
  local p
  for p in "${SLURM_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${SLURM_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "/etc/netns/$A" "/etc/netns/$B"
}
on_a() { ip netns exec "$A" env SLURM_CONF="$TMP/slurm/slurm.conf" "$@"; }
# host_ns NAME: runs the rest in namespace NAME with host name HOST (a UTS namespace of its own).
in_host() {
  local ns="$1" host="$2"; shift 2
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}
slurm_up() {
  local subnet="$1" d="$TMP/slurm" ns
  for c in slurmctld slurmd srun sbatch munged; do
    command -v "$c" >/dev/null || { echo "SKIP: $c missing (apt-get install slurm-wlm munge)"; exit 77; }
  done
  mkdir -p "$d/munge" "$d/state" "$d/spool" && chmod 711 "$d/munge"
  for ns in "$A" "$B"; do
    mkdir -p "/etc/netns/$ns"
    printf '127.0.0.1 localhost\n%s.1 %s\n%s.2 %s\n' "$subnet" "$SLURM_NODE_A" "$subnet" "$SLURM_NODE_B" \
      >"/etc/netns/$ns/hosts"
  done
  dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none && chmod 400 "$d/munge/munge.key"
  munged --force --foreground --num-threads=1 --socket="$d/munge/socket" --key-file="$d/munge/munge.key" \
    --pid-file="$d/munge/pid" --log-file="$d/munge/log" --seed-file="$d/munge/seed" &
  SLURM_PIDS+=($!)
  cat >"$d/slurm.conf" <<EOF
ClusterName=tessera
SlurmctldHost=$SLURM_NODE_A($subnet.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge/socket
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.%n.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=30
MinJobAge=2
InactiveLimit=0
NodeName=$SLURM_NODE_A NodeAddr=$subnet.1 CPUs=2 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
NodeName=$SLURM_NODE_B NodeAddr=$subnet.2 CPUs=2 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=$SLURM_NODE_A,$SLURM_NODE_B Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmd loads a cgroup plugin even with proctrack/linuxproc: name the hierarchy this machine has.
  local cg=cgroup/v1
  [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] && cg=cgroup/v2
  printf 'CgroupPlugin=%s\nCgroupMountpoint=/sys/fs/cgroup\n' "$cg" >"$d/cgroup.conf"
  [ "$cg" = cgroup/v2 ] && echo "IgnoreSystemd=yes" >>"$d/cgroup.conf"  # no systemd to ask for a scope
  # Two GPUs per node declared by hand (no device files: the tasks run CPU ranks), so the jobs
  # ask for them as on a GPU cluster (--gpus-per-node).
  echo "Name=gpu File=/dev/null,/dev/zero" >"$d/gres.conf"
  mkdir -p "$d/spool/$SLURM_NODE_A" "$d/spool/$SLURM_NODE_B"
  for _ in $(seq 1 50); do [ -S "$d/munge/socket" ] && break; sleep 0.1; done
  export SLURM_CONF="$d/slurm.conf"
  in_host "$A" "$SLURM_NODE_A" slurmctld -D -i -f "$d/slurm.conf" >"$d/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  in_host "$A" "$SLURM_NODE_A" slurmd -D -N "$SLURM_NODE_A" -f "$d/slurm.conf" >"$d/slurmd.a.out" 2>&1 &
  SLURM_PIDS+=($!)
  in_host "$B" "$SLURM_NODE_B" slurmd -D -N "$SLURM_NODE_B" -f "$d/slurm.conf" >"$d/slurmd.b.out" 2>&1 &
  SLURM_PIDS+=($!)
  local state=""
  for _ in $(seq 1 300); do
    state="$(on_a sinfo -h -N -o '%N %t' 2>/dev/null | sort | tr '\n' ' ')"
    [ "$state" = "$SLURM_NODE_A idle $SLURM_NODE_B idle " ] && return 0
    sleep 0.1
  done
  echo "FAIL: the Slurm nodes did not come up within 30 s (sinfo: $state)"
  tail -5 "$d"/*.log "$d"/*.out "$d/munge/log" 2>/dev/null
  exit 1
}
