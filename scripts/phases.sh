#!/usr/bin/env bash
# Phase timing for scripts/test.sh: `phase NAME CMD...` runs CMD and records its wall time;
# `ctest_phase NAME CTEST-ARGS...` also keeps ctest's output so that the 15 slowest tests of
# the suite can be listed; `phase_report` prints the table (called on exit, pass or fail).
# Sourced, not run.
phase_log_dir=${KOLO_PHASE_LOGS:-build/phases}
mkdir -p "$phase_log_dir"
phase_names=()
phase_secs=()
phase_start_all=$(date +%s)

phase() {
  local name=$1; shift
  local t0; t0=$(date +%s)
  local rc=0
  "$@" || rc=$?
  phase_names+=("$name")
  phase_secs+=($(( $(date +%s) - t0 )))
  return $rc
}

ctest_phase() {
  local name=$1; shift
  local log="$phase_log_dir/$name.log"
  local t0; t0=$(date +%s)
  local rc=0
  ctest "$@" 2>&1 | tee "$log" || rc=$?  # pipefail: ctest's status, not tee's
  phase_names+=("$name")
  phase_secs+=($(( $(date +%s) - t0 )))
  return $rc
}

phase_report() {
  local rc=$?
  # The report only reads logs: none of its pipes may change the run's status (under pipefail a
  # `sort | head` would end in SIGPIPE, 141).
  set +e +o pipefail
  local total=$(( $(date +%s) - phase_start_all ))
  echo
  echo "== phases (wall seconds; budget for the whole: 1800 s; load average now: $(cut -d' ' -f1-3 /proc/loadavg)) =="
  local i
  for i in "${!phase_names[@]}"; do
    printf '  %-14s %6d s\n' "${phase_names[$i]}" "${phase_secs[$i]}"
  done
  printf '  %-14s %6d s\n' total "$total"
  local log
  for log in "$phase_log_dir"/*.log; do
    [ -f "$log" ] || continue
    echo "== 15 slowest tests of $(basename "$log" .log) =="
    # ctest's lines: "  12/774 Test  #12: Suite.Name ......   Passed    1.23 sec"
    grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$log" |
      sed -E 's/^.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec.*$/\2 \1/' |
      sort -rn | awk 'NR <= 15 {printf "  %8.2f s  %s\n", $1, $2}'
  done
  exit $rc
}
trap phase_report EXIT
