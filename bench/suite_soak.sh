#!/usr/bin/env bash
# The whole release suite PASSES times in a row (CI's command: ctest --preset release -j N
# --timeout 600), under load: a second suite (the ASan one, -LE slow, over and over) runs
# beside it at the same priority. One line per pass; stops at the first pass with a failure
# and names its tests. Exit 0 only when every pass passed.
#   usage: bench/suite_soak.sh [PASSES]   (default 20)
#   environment: LOAD=asan (default) | none; LOGS=DIR (default build/suite_soak);
#   CTEST_ARGS: more ctest arguments for the passes (-R ... to try the script on a few tests)
# Build the release preset first (scripts/test.sh builds both); the passes rebuild nothing, so
# that the binaries stay the same across them. With LOAD=asan the load builds the asan preset
# (when it is not built yet, the compile is the first load), then loops its suite.
set -euo pipefail
cd "$(dirname "$0")/.."
passes=${1:-20}
load=${LOAD:-asan}
logs=${LOGS:-build/suite_soak}
jobs=$(nproc)
mkdir -p "$logs"
[ -d build/release ] || { echo "suite_soak: build/release is missing (run scripts/test.sh)" >&2; exit 2; }

loadpid=
stop_load() {
  if [ -n "$loadpid" ]; then kill -TERM -- "-$loadpid" 2>/dev/null || true; fi
}
trap stop_load EXIT
if [ "$load" = asan ]; then
  # Its own process group, so that stopping it stops its tests too.
  # It first builds the asan preset (nothing to do when it is built already).
  setsid bash -c "{ cmake --preset asan -DKOLO_WERROR=ON && cmake --build --preset asan -j $jobs; } \
      >'$logs/load_build.log' 2>&1 || { echo 'load: the asan build failed' >>'$logs/load.txt'; exit 1; }
    echo 'load: asan build done' >>'$logs/load.txt'
    i=0; while true; do i=\$((i + 1));
    ctest --preset asan -j $jobs --timeout 900 -LE slow >\"$logs/load_\$i.log\" 2>&1;
    echo \"load pass \$i: \$(grep -E 'tests passed' \"$logs/load_\$i.log\")\" >>'$logs/load.txt'; done" &
  loadpid=$!
fi

echo "suite_soak: $passes passes of the release suite at $(git rev-parse --short HEAD), load: $load"
for pass in $(seq 1 "$passes"); do
  start=$(date +%s)
  status=0
  # shellcheck disable=SC2086
  ctest --preset release -j "$jobs" --timeout 600 ${CTEST_ARGS:-} >"$logs/pass_$pass.log" 2>&1 ||
    status=$?
  # A pass that ran no test (no summary) is a failure too.
  summary=$(grep -E 'tests passed' "$logs/pass_$pass.log") || { summary="no summary"; status=1; }
  echo "pass $pass: $summary, $(($(date +%s) - start)) s, load average $(cut -d' ' -f1 /proc/loadavg)"
  if [ "$status" -ne 0 ]; then
    grep -E '^\s+[0-9]+ - ' "$logs/pass_$pass.log" | grep -vE '\((Disabled|Skipped|Not Run)\)' |
      sed 's/^\s*/  failed: /' || true
    echo "suite_soak: pass $pass failed (log: $logs/pass_$pass.log)"
    exit 1
  fi
done
echo "suite_soak: $passes passes in a row, every test passed"
