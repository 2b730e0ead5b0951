# A real Slurm cluster of two nodes on one machine, for tests (sourced by bash scripts): munged
# on a socket of its own, slurmctld and one slurmd on host 1 and one slurmd on host 2 (the
# network namespaces of netns_hosts.sh, each under its own host name), state, spool and logs
# under $dir. Functions: slurm_missing, slurm_start, slurm_on_host1, slurm_stop.

# Prints which Slurm or munge command is missing (and returns 1), or returns 0.
slurm_missing() {
  local command
  for command in munged slurmctld slurmd srun sbatch scontrol sinfo squeue scancel unshare; do
    if ! command -v "$command" >/dev/null 2>&1; then
      echo "$command is missing (Debian: slurm-wlm, munge)"
      return 0
    fi
  done
  return 1
}

# slurm_on_host1 COMMAND...: a Slurm client command (srun, sbatch, scontrol...) on host 1,
# where slurmctld listens, as a user on the cluster's login node would run it.
slurm_on_host1() {
  netns_on "$NETNS_H1" env SLURM_CONF="$dir/slurm.conf" "$@"
}

# slurm_daemon_on NS COMMAND...: netns_on for slurmd, which initialises a cgroup plugin even
# when no cgroup is used (proctrack/linuxproc, task/none): `ip netns exec` mounts a fresh
# /sys without the cgroup tree, so an empty tmpfs there stands for a cgroup v1 root (in that
# namespace's own mounts only).
slurm_daemon_on() {
  local ns="$1"
  shift
  ip netns exec "$ns" unshare --uts sh -c \
    'hostname "$0" && mount -t tmpfs kolo-cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd kolo-cgroup /sys/fs/cgroup/systemd && exec "$@"' "$ns" "$@"
}

# Writes the configuration, starts the daemons (their PIDs go into $pids) and waits, for at
# most 30 s, until both nodes are idle. Each node has the machine's real CPU count.
slurm_start() {
  local cpus
  cpus="$(getconf _NPROCESSORS_ONLN)"
  mkdir -p "$dir/munge" "$dir/ctld" "$dir/slurmd.$NETNS_H1" "$dir/slurmd.$NETNS_H2"
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 755 "$dir" "$dir/munge"
  chmod 400 "$dir/munge/munge.key"
  cat >"$dir/slurm.conf" <<CONF
ClusterName=kolotest
SlurmctldHost=$NETNS_H1($NETNS_ADDR1)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/slurmd.%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
InactiveLimit=0
KillWait=2
MessageTimeout=10
NodeName=$NETNS_H1 NodeAddr=$NETNS_ADDR1 NodeHostname=$NETNS_H1 CPUs=$cpus State=UNKNOWN
NodeName=$NETNS_H2 NodeAddr=$NETNS_ADDR2 NodeHostname=$NETNS_H2 CPUs=$cpus State=UNKNOWN
PartitionName=kolo Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  munged --foreground --force --key-file="$dir/munge/munge.key" \
    --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" &
  pids+=($!)
  netns_on "$NETNS_H1" slurmctld -D -c -f "$dir/slurm.conf" >"$dir/slurmctld.out" 2>&1 &
  pids+=($!)
  slurm_daemon_on "$NETNS_H1" slurmd -D -N "$NETNS_H1" -f "$dir/slurm.conf" >"$dir/slurmd1.out" 2>&1 &
  pids+=($!)
  slurm_daemon_on "$NETNS_H2" slurmd -D -N "$NETNS_H2" -f "$dir/slurm.conf" >"$dir/slurmd2.out" 2>&1 &
  pids+=($!)
  local deadline=$((SECONDS + 30)) states=""
  while [ $SECONDS -lt $deadline ]; do
    states="$(slurm_on_host1 sinfo -h -N -o '%N %t' 2>/dev/null | sort | tr '\n' ' ')"
    if [ "$states" = "$NETNS_H1 idle $NETNS_H2 idle " ]; then return 0; fi
    sleep 0.2
  done
  echo "the Slurm nodes did not become idle within 30 s (sinfo: '$states')"
  tail -n 20 "$dir/slurmctld.log" "$dir/slurmctld.out" "$dir"/slurmd*.log "$dir"/slurmd*.out \
    "$dir/munge/munged.log" 2>/dev/null
  return 1
}

# Cancels every job, stops the daemons and kills whatever still runs in either host's
# namespace (tasks and slurmstepd of a step that did not end); safe to call twice.
slurm_stop() {
  local pid ns
  [ -f "$dir/slurm.conf" ] && timeout 5 ip netns exec "$NETNS_H1" env SLURM_CONF="$dir/slurm.conf" \
    scancel --quiet --user=root >/dev/null 2>&1
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for ns in "$NETNS_H1" "$NETNS_H2"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  done
}
