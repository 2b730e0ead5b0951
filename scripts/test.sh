#!/usr/bin/env bash
# Installs dependencies, builds kolo (release and asan presets, warnings as errors) and runs
# every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# At the end, pass or fail, it prints each phase's wall time and each suite's 15 slowest tests.
source scripts/phases.sh
phase setup bash scripts/setup.sh
jobs=$(nproc)
cmake --preset release -DKOLO_WERROR=ON >/dev/null
phase build-release cmake --build --preset release -j "$jobs"
ctest_phase release --preset release -j "$jobs" --timeout 600
# Every parser of outside bytes under libFuzzer, briefly (fuzz/ctest.sh).
phase fuzz bash fuzz/ctest.sh
if [ "${KOLO_SKIP_ASAN:-0}" != 1 ]; then
  cmake --preset asan -DKOLO_WERROR=ON >/dev/null
  phase build-asan cmake --build --preset asan -j "$jobs"
  # Under ASan+UBSan: everything but the tests labelled slow (training runs, multi-host
  # scenarios, the install test).
  ctest_phase asan --preset asan -j "$jobs" --timeout 900 -LE 'slow'
fi
