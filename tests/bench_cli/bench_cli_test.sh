#!/usr/bin/env bash
# End-to-end test of `kolo bench`: tiny sweeps over every collective with forked ranks
# (and, when given mpirun, under mpirun with the MPI backend) must report correct=true for
# every size and exit 0. Usage: bench_cli_test.sh KOLO [MPIRUN]
set -u
kolo="$1"
mpirun="${2:-}"
failures=0

# check_rows NAME EXPECTED_ROWS OUTPUT: every JSON row has the required keys and correct=true.
check_rows() {
  local name="$1" expected="$2" output="$3"
  local rows good
  rows=$(grep -c '^{' <<<"$output")
  good=$(grep '^{' <<<"$output" | grep '"bytes":' | grep '"np":' | grep '"t_median_us":' | grep '"algbw_GBps":' \
         | grep '"busbw_GBps":' | grep -c '"correct":true')
  if [ "$rows" -ne "$expected" ] || [ "$good" -ne "$expected" ]; then
    echo "FAIL $name: $good of $rows rows correct, expected $expected rows"
    echo "$output"
    failures=$((failures + 1))
  else
    echo "ok   $name ($rows rows)"
  fi
}

for collective in allreduce reduce broadcast allgather reducescatter alltoall gather scatter; do
  out=$(timeout 120 "$kolo" bench "$collective" --ranks 2 --sizes 1000,4K,65537 -n 3 -w 1 --json --timeout 30 -r 1)
  rc=$?
  [ $rc -eq 0 ] || { echo "FAIL $collective --ranks 2: exit code $rc"; failures=$((failures + 1)); }
  check_rows "$collective --ranks 2" 3 "$out"
done

# Three ranks, a non-power-of-two sweep, out of place, another dtype and op.
out=$(timeout 120 "$kolo" bench allreduce --ranks 3 -b 1000 -e 100000 -f 10 -n 2 -w 1 --json --out-of-place -d bf16 -o avg)
rc=$?
[ $rc -eq 0 ] || { echo "FAIL allreduce --ranks 3 bf16 avg: exit code $rc"; failures=$((failures + 1)); }
check_rows "allreduce --ranks 3 bf16 avg out of place" 3 "$out"

# More ranks than most test machines have CPUs (bound round robin, oversubscribed), and
# unbound ranks.
out=$(timeout 120 "$kolo" bench allreduce --ranks 4 --sizes 1000,4K,1M -n 3 -w 1 --json --timeout 30)
rc=$?
[ $rc -eq 0 ] || { echo "FAIL allreduce --ranks 4: exit code $rc"; failures=$((failures + 1)); }
check_rows "allreduce --ranks 4 (bound round robin)" 3 "$out"
out=$(timeout 120 "$kolo" bench allreduce --ranks 2 --bind none --sizes 4K,1M -n 3 -w 1 --json --timeout 30)
rc=$?
[ $rc -eq 0 ] || { echo "FAIL allreduce --ranks 2 --bind none: exit code $rc"; failures=$((failures + 1)); }
check_rows "allreduce --ranks 2 --bind none" 2 "$out"

# The table form names its columns.
out=$(timeout 120 "$kolo" bench allreduce --ranks 2 --sizes 4K -n 2 -w 0)
if ! grep -q 'busbw(GB/s)' <<<"$out" || ! grep -qE '^ +4096 +1024 .* yes$' <<<"$out"; then
  echo "FAIL table output"; echo "$out"; failures=$((failures + 1))
else
  echo "ok   table output"
fi

# A bad option is refused with a non-zero exit code.
if timeout 30 "$kolo" bench allreduce --ranks 2 --sizes 4K --dtype f17 >/dev/null 2>&1; then
  echo "FAIL --dtype f17 was accepted"; failures=$((failures + 1))
else
  echo "ok   bad dtype refused"
fi

if [ -n "$mpirun" ]; then
  out=$(timeout 120 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$kolo" bench allreduce --backend mpi \
        --sizes 1000,4K,1M -n 3 -w 1 --json 2>&1)
  check_rows "allreduce under mpirun (MPI backend)" 3 "$out"
fi

[ $failures -eq 0 ] && echo "all bench CLI checks passed"
exit $((failures > 0))
