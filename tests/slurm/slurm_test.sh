#!/usr/bin/env bash
# kolo under a real Slurm: munged, slurmctld and two slurmd, each slurmd on a host of its own
# (a network namespace with its own address and host name), as two nodes. On it, as a user
# types them on the login node (host 1), with nothing set by hand:
#   1. srun -N 2 --ntasks-per-node 2 kolo train (multi-worker-mirrored): the store on the
#      step's first node at the port from the job id; the final weights must equal those of
#      `kolo run -n 4` with the same flags;
#   2. the same training as an sbatch job (its script runs srun), the same weights again, and
#      as `srun --ntasks-per-node 1 kolo run -n 2` (one launcher per node, nodes from Slurm);
#   2c. an sbatch --requeue job requeued (scontrol requeue) once it has written a checkpoint:
#      its second run resumes from it by itself, and its weights equal an uninterrupted srun's;
#   3a. federated under srun --ntasks-per-node 1 kolo run (and srun alone refused at once);
#   3. a parameter-server job under srun, roles from SLURM_PROCID with KOLO_PS_SERVERS=1, and
#      pipeline (4 stages) and fsdp jobs whose weights equal those of kolo run -n 4;
#   4. srun of a longer training whose rank 3 (on node 2) is killed with SIGKILL from outside
#      once the job trains: the step must end, with an error that names rank 3, in bounded time;
#   4b. srun --ntasks-per-node 1 kolo run --elastic -n 2: both ranks of node 2 killed after a
#      step; the survivors on node 1 go on and finish, the step ends with status 0;
#   5. KOLO_BACKEND=mpi under srun: kolo's own error, not Open MPI's abort.
# Everything is torn down on exit, whatever happens. Exit 77 (ctest SKIP) with a message where
# namespaces are forbidden or Slurm, munge or Fashion-MNIST is missing.
# Usage: slurm_test.sh KOLO_BINARY
set -u
kolo="$1"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../comm_multihost/netns_hosts.sh
. "$here/../comm_multihost/netns_hosts.sh"
# shellcheck source=slurm_cluster.sh
. "$here/slurm_cluster.sh"

if why="$(slurm_missing)"; then
  echo "SKIPPED: Slurm test: $why"
  exit 77
fi
netns_test_begin "Slurm test" fashion-mnist
trap 'slurm_stop; netns_test_end' EXIT
netns_name_hosts
chmod 755 "$dir"

fail() {
  echo "FAIL: $1"
  shift
  for file in "$@"; do echo "--- $file"; tail -n 30 "$file"; done
  echo "--- slurmctld.log"; tail -n 15 "$dir/slurmctld.log"
  exit 1
}

slurm_start || fail "the cluster did not start"
echo "cluster: $(slurm_on_host1 sinfo -h -N -o '%N (%t, %c CPUs)' | tr '\n' ' ')"
echo "  slurmctld on $NETNS_H1 ($NETNS_ADDR1), slurmd on $NETNS_H1 ($NETNS_ADDR1) and $NETNS_H2 ($NETNS_ADDR2)"

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 KOLO_TIMEOUT=60
flags=(--strategy multi-worker-mirrored --model mlp --optimizer sgd --lr 0.1 --momentum 0.9
  --batch 64 --seed 3 --threads 1 --quiet)
train=("$kolo" train "${flags[@]}" --epochs 1 --train-limit 2048)

# Max |a - b| over two safetensors files with the same tensors; exit 1 if they differ in
# names or shapes, or by more than a float rounding of the all-reduce's order.
compare_weights() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n]); body = data[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__": continue
        a, b = t["data_offsets"]
        out[name] = (t["shape"], struct.unpack("<%df" % ((b - a) // 4), body[a:b]))
    return out
x, y = load(sys.argv[1]), load(sys.argv[2])
if x.keys() != y.keys() or any(x[k][0] != y[k][0] for k in x): sys.exit("different tensors")
worst = max(abs(p - q) for k in x for p, q in zip(x[k][1], y[k][1]))
count = sum(len(v[1]) for v in x.values())
print("%d tensors, %d values, max |difference| %.3g" % (len(x), count, worst))
sys.exit(0 if worst <= 1e-5 else 1)
PY
}

# The reference: four ranks of kolo run on host 1.
netns_on "$NETNS_H1" timeout 120 "$kolo" run -n 4 --bind none -- "${train[@]}" \
  --save "$dir/run.safetensors" >"$dir/run.out" 2>&1 || fail "kolo run -n 4 failed" "$dir/run.out"

# 1. srun across both nodes.
step_started=$SECONDS
slurm_on_host1 timeout 120 srun -N 2 --ntasks-per-node 2 -O --kill-on-bad-exit=1 \
  sh -c 'echo "task $SLURM_PROCID on $(hostname)" >&2; exec "$@"' sh \
  "${train[@]}" --save "$dir/srun.safetensors" >"$dir/srun.out" 2>"$dir/srun.err" ||
  fail "srun -N 2 --ntasks-per-node 2 kolo train failed" "$dir/srun.out" "$dir/srun.err"
for task in 0 1; do
  grep -q "task $task on $NETNS_H1" "$dir/srun.err" || fail "task $task did not run on $NETNS_H1" "$dir/srun.err"
done
for task in 2 3; do
  grep -q "task $task on $NETNS_H2" "$dir/srun.err" || fail "task $task did not run on $NETNS_H2" "$dir/srun.err"
done
echo "job: srun -N 2 --ntasks-per-node 2 kolo train ... (tasks 0-1 on $NETNS_H1, 2-3 on $NETNS_H2; $((SECONDS - step_started)) s)"
echo "  $(grep -m1 test_accuracy "$dir/srun.out" || tail -n 1 "$dir/srun.out")"
result="$(compare_weights "$dir/srun.safetensors" "$dir/run.safetensors")" ||
  fail "srun's weights differ from kolo run -n 4's: $result"
echo "  weights equal kolo run -n 4's: $result"

# 2. The same as an sbatch job.
cat >"$dir/job.sh" <<JOB
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node 2
#SBATCH -O
srun ${train[*]} --save $dir/sbatch.safetensors
JOB
job="$(slurm_on_host1 sbatch --parsable -o "$dir/sbatch.out" "$dir/job.sh")" ||
  fail "sbatch refused the job"
state=""
deadline=$((SECONDS + 120))
while [ $SECONDS -lt $deadline ]; do
  state="$(slurm_on_host1 scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)"
  case "$state" in PENDING | CONFIGURING | RUNNING | COMPLETING | "") sleep 0.2 ;; *) break ;; esac
done
[ "$state" = COMPLETED ] || fail "sbatch job $job ended $state" "$dir/sbatch.out"
result="$(compare_weights "$dir/sbatch.safetensors" "$dir/run.safetensors")" ||
  fail "the sbatch job's weights differ from kolo run -n 4's: $result"
echo "job $job: sbatch -N 2 --ntasks-per-node 2 (srun kolo train ...): $state"
echo "  weights equal kolo run -n 4's: $result"

# 2c. A batch job requeued while it trains (sbatch --requeue; scontrol requeue once it has
# written a checkpoint): its second run (SLURM_RESTART_COUNT=1) resumes from the checkpoint
# directory by itself, and its final weights equal those of the same srun trained in one go.
# (Not kolo run -n 4's: on one host its update is sharded, whose rounding differs from the
# whole update's, and 128 steps of momentum SGD amplify that to 1e-2.)
long=("$kolo" train "${flags[@]}" --epochs 1 --train-limit 8192)
slurm_on_host1 timeout 120 srun -N 2 --ntasks-per-node 2 -O "${long[@]}" \
  --save "$dir/srun_long.safetensors" >"$dir/srun_long.out" 2>&1 || fail "srun of the long training failed" "$dir/srun_long.out"
cat >"$dir/requeue.sh" <<JOB
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node 2
#SBATCH -O
#SBATCH --requeue
#SBATCH --open-mode=append
echo "run \$SLURM_RESTART_COUNT of job \$SLURM_JOB_ID"
srun ${long[*]} --checkpoint-dir $dir/ckpt --checkpoint-every 8 --save $dir/requeue.safetensors
JOB
job="$(slurm_on_host1 sbatch --parsable -o "$dir/requeue.out" "$dir/requeue.sh")" || fail "sbatch refused the requeue job"
deadline=$((SECONDS + 60))
until compgen -G "$dir/ckpt/ckpt-*" >/dev/null; do
  [ $SECONDS -lt $deadline ] || fail "job $job wrote no checkpoint" "$dir/requeue.out"
  sleep 0.1
done
slurm_on_host1 scontrol requeue "$job" || fail "scontrol requeue $job failed" "$dir/requeue.out"
requeued_at="$(ls "$dir/ckpt")"
# Slurm makes a requeued job eligible only about two minutes later (its EligibleTime), which
# a user waits out; the test moves it to now once the job is pending again.
state=""
deadline=$((SECONDS + 60))
until [ "$state" = PENDING ]; do
  [ $SECONDS -lt $deadline ] || fail "requeued job $job is $state, not pending again" "$dir/requeue.out"
  sleep 0.1
  state="$(slurm_on_host1 scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)"
done
slurm_on_host1 scontrol update JobId="$job" StartTime=now || fail "scontrol update StartTime=now of job $job failed"
deadline=$((SECONDS + 120))
while [ $SECONDS -lt $deadline ]; do
  state="$(slurm_on_host1 scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)"
  restarts="$(slurm_on_host1 scontrol show job "$job" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2)"
  [ "$state" = COMPLETED ] && [ "${restarts:-0}" -ge 1 ] && break
  case "$state" in FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
  sleep 0.2
done
[ "$state" = COMPLETED ] && [ "${restarts:-0}" -ge 1 ] || fail "requeued job $job ended $state after ${restarts:-0} restart(s)" "$dir/requeue.out"
grep -q "run 1 of job $job" "$dir/requeue.out" || fail "job $job did not run a second time" "$dir/requeue.out"
grep -q "requeued Slurm job: resuming from its checkpoints checkpoint=$dir/ckpt" "$dir/requeue.out" ||
  fail "the requeued job did not resume from its checkpoints" "$dir/requeue.out"
first_step="$(grep -o 'first_step=[0-9]*' "$dir/requeue.out" | tail -n 1 | cut -d= -f2)"
[ "${first_step:-0}" -gt 0 ] || fail "the requeued job's second run started at step ${first_step:-0}" "$dir/requeue.out"
result="$(compare_weights "$dir/requeue.safetensors" "$dir/srun_long.safetensors")" ||
  fail "the requeued job's weights differ from an srun trained in one go: $result" "$dir/requeue.out"
echo "job $job: sbatch --requeue (srun kolo train --checkpoint-dir ...), scontrol requeue at $(echo $requeued_at | tr '\n' ' ')"
echo "  second run (SLURM_RESTART_COUNT=1) resumed at step $first_step: $state; weights equal an uninterrupted srun's: $result"

# 2b. One kolo run per node (srun --ntasks-per-node 1): node count, node rank and the store
# from Slurm, two ranks each; the same weights again.
slurm_on_host1 timeout 120 srun -N 2 --ntasks-per-node 1 -O \
  "$kolo" run -n 2 --bind none -- \
  sh -c 'echo "rank $KOLO_RANK of $KOLO_WORLD_SIZE on $(hostname)"; exec "$@"' sh \
  "${train[@]}" --save "$dir/run_srun.safetensors" \
  >"$dir/run_srun.out" 2>&1 || fail "srun --ntasks-per-node 1 kolo run -n 2 failed" "$dir/run_srun.out"
for rank in 0 1 2 3; do
  host=$NETNS_H1
  [ $rank -lt 2 ] || host=$NETNS_H2
  grep -q "rank $rank of 4 on $host" "$dir/run_srun.out" ||
    fail "kolo run under srun: rank $rank of 4 did not run on $host" "$dir/run_srun.out"
done
result="$(compare_weights "$dir/run_srun.safetensors" "$dir/run.safetensors")" ||
  fail "srun kolo run -n 2's weights differ from kolo run -n 4's: $result"
echo "job: srun -N 2 --ntasks-per-node 1 kolo run -n 2 -- kolo train ... (ranks 0-1 on $NETNS_H1, 2-3 on $NETNS_H2)"
echo "  weights equal kolo run -n 4's: $result"

# 3. Parameter servers: rank 0 the server, rank 1 the chief, ranks 2 and 3 (node 2) workers.
KOLO_PS_SERVERS=1 slurm_on_host1 timeout 120 srun -N 2 --ntasks-per-node 2 -O \
  "$kolo" train --strategy parameter-server --ps-mode sync --model mlp --optimizer sgd \
  --lr 0.1 --batch 64 --epochs 1 --train-limit 2048 --ps-unit-batches 4 --threads 1 --quiet \
  >"$dir/ps.out" 2>"$dir/ps.err" || fail "the parameter-server job under srun failed" "$dir/ps.out" "$dir/ps.err"
grep -q 'test_accuracy .* ps_mode sync .* workers_alive 2' "$dir/ps.out" ||
  fail "no summary of the chief with 2 live workers" "$dir/ps.out" "$dir/ps.err"
echo "job: KOLO_PS_SERVERS=1 srun -N 2 --ntasks-per-node 2 kolo train --strategy parameter-server ..."
echo "  $(grep -o 'test_accuracy [0-9.]*.*workers_alive [0-9]*' "$dir/ps.out")"

# 3a. Federated: one kolo run per node (its launcher serves the store the server and the client
# hosts share): the server on rank 0, client hosts on ranks 1-3. Started by srun without kolo
# run, kolo refuses at once, naming the form that works.
fed=("$kolo" train --strategy federated --model mlp --clients 8 --clients-per-round 4 --rounds 3
  --local-batch 32 --train-limit 2048 --threads 1 --quiet)
slurm_on_host1 timeout 120 srun -N 2 --ntasks-per-node 1 -O "$kolo" run -n 2 --tolerate-failures \
  --bind none -- "${fed[@]}" >"$dir/fed.out" 2>&1 || fail "the federated job under srun failed" "$dir/fed.out"
grep -q 'test_accuracy [0-9.]* rounds 3 clients 8 hosts 3 ' "$dir/fed.out" ||
  fail "no summary of the federated server with 3 client hosts" "$dir/fed.out"
echo "job: srun -N 2 --ntasks-per-node 1 kolo run -n 2 --tolerate-failures -- kolo train --strategy federated ..."
echo "  $(grep -o 'test_accuracy .*hosts 3' "$dir/fed.out")"
slurm_on_host1 timeout 60 srun -N 1 -n 2 "${fed[@]}" >"$dir/fed_srun.out" 2>&1 &&
  fail "the federated job under srun without kolo run trained" "$dir/fed_srun.out"
grep -q "under slurm (rank 0 of 2) needs kolo run's store" "$dir/fed_srun.out" ||
  fail "srun of the federated job without kolo run did not give kolo's error" "$dir/fed_srun.out"
echo "job: srun -n 2 kolo train --strategy federated: $(grep -m1 -o 'strategy federated under slurm (rank 0 of 2)[^:]*' "$dir/fed_srun.out")"

# 3b. Pipeline (4 stages, one per task) and fsdp under srun, each against kolo run -n 4.
for kind in pipeline fsdp; do
  if [ $kind = pipeline ]; then
    job_flags=(--strategy pipeline --stages 4 --micro-batches 4)
  else
    job_flags=(--strategy fsdp)
  fi
  other=("$kolo" train --model mlp --optimizer sgd --lr 0.1 --batch 64 --seed 3 --threads 1 --quiet
    --epochs 1 --train-limit 1024 "${job_flags[@]}")
  netns_on "$NETNS_H1" timeout 120 "$kolo" run -n 4 --bind none -- "${other[@]}" \
    --save "$dir/run_$kind.safetensors" >"$dir/run_$kind.out" 2>&1 ||
    fail "kolo run -n 4 of $kind failed" "$dir/run_$kind.out"
  slurm_on_host1 timeout 120 srun -N 2 --ntasks-per-node 2 -O "${other[@]}" \
    --save "$dir/srun_$kind.safetensors" >"$dir/srun_$kind.out" 2>&1 ||
    fail "srun of $kind failed" "$dir/srun_$kind.out"
  result="$(compare_weights "$dir/srun_$kind.safetensors" "$dir/run_$kind.safetensors")" ||
    fail "srun's $kind weights differ from kolo run -n 4's: $result"
  echo "job: srun -N 2 --ntasks-per-node 2 kolo train ${job_flags[*]} ..."
  echo "  weights equal kolo run -n 4's: $result"
done

# 4. A task killed from outside: rank 3, on node 2, once it has completed a training step
# (its status file says "training"; a step takes every rank's all-reduce, so the rendezvous is
# over: a rank killed during it would leave the others waiting for it until KOLO_TIMEOUT).
KOLO_STATUS_FILE="$dir/kill-status" slurm_on_host1 timeout 120 srun -N 2 --ntasks-per-node 2 -O \
  "$kolo" train "${flags[@]}" --epochs 50 >"$dir/kill.out" 2>"$dir/kill.err" &
srun_pid=$!
pids+=("$srun_pid")
victim=""
deadline=$((SECONDS + 60))
while [ -z "$victim" ] && [ $SECONDS -lt $deadline ] && kill -0 "$srun_pid" 2>/dev/null; do
  if grep -q '"state": *"training"' "$dir/kill-status.rank-3" 2>/dev/null; then
    for pid in $(ip netns pids "$NETNS_H2"); do
      if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$kolo")" ] &&
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'SLURM_PROCID=3'; then
        victim=$pid
      fi
    done
  fi
  [ -n "$victim" ] || sleep 0.2
done
[ -n "$victim" ] || fail "rank 3 of the long job never trained on $NETNS_H2" "$dir/kill.out" "$dir/kill.err"
kill -KILL "$victim"
killed_at=$SECONDS
wait "$srun_pid"
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "srun of the job whose rank 3 was killed ended with status $rc" "$dir/kill.out" "$dir/kill.err"
grep -q "rank 3" "$dir/kill.err" "$dir/kill.out" ||
  fail "no error names rank 3" "$dir/kill.out" "$dir/kill.err"
echo "job: rank 3 (pid $victim on $NETNS_H2) killed with SIGKILL; srun exited $rc after $((SECONDS - killed_at)) s:"
grep -h -m2 "rank 3" "$dir/kill.err" "$dir/kill.out" | sed 's/^/  /'

# 4b. Elastic within the allocation: one `kolo run --elastic` per node (nodes and store from
# Slurm), two ranks each; once rank 3 has completed a step, both ranks of node 2 are killed
# with SIGKILL. The survivors on node 1 (--min-ranks 2) must go on and finish the training
# (node 2's launcher starts replacements, which join if the job is still running: --batch 96
# splits over 2, 3 and 4 ranks), and the step end with status 0.
slurm_on_host1 timeout 120 srun -N 2 --ntasks-per-node 1 -O \
  "$kolo" run --elastic --min-ranks 2 -n 2 --bind none --timeout 8 -- \
  "$kolo" train --strategy multi-worker-mirrored --model mlp --optimizer sgd --lr 0.1 --batch 96 \
  --seed 3 --threads 1 --quiet --epochs 1 --train-limit 12288 --debug-sample-log "$dir/samples" \
  >"$dir/elastic.out" 2>&1 &
srun_pid=$!
pids+=("$srun_pid")
lines() { if [ -e "$1" ]; then wc -l <"$1"; else echo 0; fi; }
deadline=$((SECONDS + 60))
while [ "$(lines "$dir/samples.rank-3")" -lt 2 ] && [ $SECONDS -lt $deadline ] &&
  kill -0 "$srun_pid" 2>/dev/null; do
  sleep 0.1
done
[ "$(lines "$dir/samples.rank-3")" -ge 2 ] || fail "rank 3 of the elastic job never completed a step" "$dir/elastic.out"
victims=()
for pid in $(ip netns pids "$NETNS_H2"); do
  if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$kolo")" ] &&
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'KOLO_RANK=[23]'; then
    victims+=("$pid")
  fi
done
[ ${#victims[@]} -eq 2 ] || fail "found ${#victims[@]} ranks of the elastic job on $NETNS_H2, not 2" "$dir/elastic.out"
kill -KILL "${victims[@]}"
wait "$srun_pid"
rc=$?
[ $rc -eq 0 ] || fail "the elastic step ended with status $rc after node 2's ranks were killed" "$dir/elastic.out"
[ "$(grep -c 'rank [23] (pid [0-9]*) was killed by signal 9 (SIGKILL); the elastic job goes on' "$dir/elastic.out")" = 2 ] ||
  fail "node 2's launcher did not report both its ranks lost" "$dir/elastic.out"
# Ranks 2 and 3 left (in one change or two) and ranks 0 and 1 stayed members throughout.
lost="$(grep -o 'membership changed .*lost_ranks=[0-9,]*' "$dir/elastic.out" | sed 's/.*lost_ranks=//' | tr ',' '\n' | grep . | sort -u | tr '\n' ' ')"
[ "$lost" = "2 3 " ] || fail "the ranks lost were '$lost', not 2 and 3" "$dir/elastic.out"
! grep 'membership changed' "$dir/elastic.out" | grep -qv 'members=0,1[, ]' ||
  fail "ranks 0 and 1 did not stay members of every generation" "$dir/elastic.out"
grep -q 'test_accuracy .* world_size [2-4] ' "$dir/elastic.out" ||
  fail "the elastic job did not finish" "$dir/elastic.out"
echo "job: srun -N 2 --ntasks-per-node 1 kolo run --elastic --min-ranks 2 -n 2 -- kolo train ...: ranks 2-3 (node 2) killed after a step, step exited $rc:"
grep -h "killed by signal\|membership changed" "$dir/elastic.out" | cut -c1-170 | sed 's/^/  /'
echo "  $(grep -o 'test_accuracy .* world_size [0-9]* generation [0-9]*' "$dir/elastic.out")"

# 5. The MPI backend asked for under srun.
KOLO_BACKEND=mpi slurm_on_host1 timeout 60 srun -N 1 -n 1 "${train[@]}" \
  >"$dir/mpi.out" 2>&1 && fail "KOLO_BACKEND=mpi under srun trained" "$dir/mpi.out"
grep -q "the MPI backend cannot start under this srun" "$dir/mpi.out" ||
  fail "KOLO_BACKEND=mpi under srun did not give kolo's error" "$dir/mpi.out"
! grep -q "OMPI\|MPI_Init" "$dir/mpi.out" || fail "Open MPI's text reached the user" "$dir/mpi.out"
echo "job: KOLO_BACKEND=mpi srun -n 1 kolo train: $(grep -m1 -o 'the MPI backend cannot start under this srun[^;]*' "$dir/mpi.out")"

echo "Slurm test passed in $SECONDS s"
