#!/bin/sh
# Soak run of the native communicator: COUNT random collectives (default 100000) over 4
# forked ranks, each result checked against closed-form values, then the same sequence
# with one rank (rank 1) sleeping up to 50 ms before 2% of its calls. Prints each run's
# summary: calls, wrong results, failures, call times and the slowest call.
# Usage: bench/soak.sh [COUNT] [BUILD_DIR]   (BUILD_DIR defaults to build/release)
# Environment: SEED (default 1), RANKS (4), MAX_BYTES (4194304), HOSTS (1).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
count=${1:-100000}
build=${2:-"$here/../build/release"}
soak="$build/bench/soak"
[ -x "$soak" ] || { echo "soak: $soak is not built (ninja -C $build soak)" >&2; exit 1; }
common="--count $count --seed ${SEED:-1} --ranks ${RANKS:-4} --max-bytes ${MAX_BYTES:-4194304} --hosts ${HOSTS:-1}"
status=0
echo "== soak: $count calls, no delays"
"$soak" $common || status=$?
echo "== soak: $count calls, rank 1 delayed"
"$soak" $common --delay-rank 1 --delay-percent 2 --delay-max-ms 50 || status=$?
if [ "$status" -eq 0 ]; then echo "soak: both runs correct"; else echo "soak: FAILED (exit $status)"; fi
exit "$status"
