#!/usr/bin/env bash
# Installs dependencies, builds kolo (release and asan presets, warnings as errors) and runs
# every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
cmake --preset release -DKOLO_WERROR=ON >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs" --timeout 600
# Every parser of outside bytes under libFuzzer, briefly (fuzz/ctest.sh).
bash fuzz/ctest.sh
if [ "${KOLO_SKIP_ASAN:-0}" != 1 ]; then
  cmake --preset asan -DKOLO_WERROR=ON >/dev/null
  cmake --build --preset asan -j "$jobs"
  # Under ASan+UBSan: everything but the tests labelled slow (training runs, multi-host
  # scenarios, the install test).
  ctest --preset asan -j "$jobs" --timeout 900 -LE 'slow'
fi
