#!/usr/bin/env bash
# scripts/phases.sh's EXIT report must leave the run's status as it was: 0 for a green run,
# the failing phase's status otherwise, with logs long enough that `sort | head` would end in
# SIGPIPE (a green CI run once ended with 141 that way). Also checks that the table and the
# 15 slowest tests are printed.
#   usage: phases_test.sh PATH/TO/phases.sh
set -u
phases=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/logs"
for i in $(seq 1 5000); do
  echo "  $i/5000 Test  #$i: Suite.Case$i ........   Passed    $((i % 97)).$((i % 10))0 sec"
done >"$dir/logs/release.log"
cp "$dir/logs/release.log" "$dir/logs/asan.log"
run() {  # run CMD: a test.sh-like script that ends with CMD's status
  cat >"$dir/run.sh" <<SCRIPT
set -euo pipefail
export KOLO_PHASE_LOGS="$dir/logs"
source "$phases"
phase work $1
SCRIPT
  bash "$dir/run.sh" >"$dir/out.txt" 2>&1
}
fail=0
run true
status=$?
[ "$status" -eq 0 ] || { echo "FAIL: a green run ended with $status"; fail=1; }
grep -q "== 15 slowest tests of release ==" "$dir/out.txt" || { echo "FAIL: no slowest-tests list"; fail=1; }
[ "$(grep -c ' s  Suite.Case' "$dir/out.txt")" -eq 30 ] || { echo "FAIL: not 15 tests per suite"; fail=1; }
grep -q "budget for the whole: 1800 s" "$dir/out.txt" || { echo "FAIL: no phase table"; fail=1; }
run "bash -c 'exit 3'"
status=$?
[ "$status" -eq 3 ] || { echo "FAIL: a run whose phase failed with 3 ended with $status"; fail=1; }
[ "$fail" -eq 0 ] && echo "PASS: green run 0, failed phase 3, report printed"
exit "$fail"
