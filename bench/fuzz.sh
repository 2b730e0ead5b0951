#!/usr/bin/env bash
# Runs every libFuzzer harness in fuzz/ for a while, one after the other, and prints a
# table: harness, seconds run, executions (libFuzzer's stat::number_of_executed_units) and
# crashes. Configures and builds the clang fuzzing build in build/fuzz first. Each harness
# starts from its seed corpus (fuzz/corpus/<harness>); what it finds is kept under
# build/fuzz/long/<harness>/ (corpus/, crash-*, timeout-*, leak-*, oom-*, log). A crash
# stops that harness (libFuzzer stops at the first one) and makes the script exit 1; copy
# its input to tests/fixtures/fuzz_regressions/<parser>/ once the parser is fixed.
#
# Usage: bench/fuzz.sh [SECONDS_PER_HARNESS]   (default 600)
# Environment: HARNESSES (names, default every fuzz/*_fuzz.cc), NICE (10: run niced).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
seconds="${1:-600}"
build="$root/build/fuzz"
workdir="$build/long"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DKOLO_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=Release -DKOLO_WITH_MPI=OFF -DKOLO_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null

harnesses="${HARNESSES:-$(cd "$root/fuzz" && ls *_fuzz.cc | sed 's/\.cc$//')}"
failed=0
rows=()
for h in $harnesses; do
  log="$workdir/$h.log"
  mkdir -p "$workdir"
  start=$(date +%s)
  set +e
  nice -n "${NICE:-10}" bash "$root/fuzz/run_harness.sh" "$build/fuzz/$h" "$root/fuzz" "$workdir" \
    "$seconds" >"$log" 2>&1
  rc=$?
  set -e
  elapsed=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  crashes=$(find "$workdir/$h" -maxdepth 1 \( -name 'crash-*' -o -name 'timeout-*' -o -name 'leak-*' \
    -o -name 'oom-*' \) | wc -l)
  cp "$log" "$workdir/$h/log"
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes="? (exit $rc, see $log)"; fi
  [ "$rc" -ne 0 ] && failed=1
  rows+=("$(printf '%-22s %8s %14s  %s' "$h" "$elapsed" "${execs:-?}" "$crashes")")
done
printf '%-22s %8s %14s  %s\n' harness seconds executions crashes
printf '%s\n' "${rows[@]}"
exit "$failed"
