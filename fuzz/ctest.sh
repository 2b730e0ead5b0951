#!/usr/bin/env bash
# The CI step of the fuzzers: configures and builds the clang fuzzing build (build/fuzz,
# only the harnesses and the parsers they drive), then runs every harness over its seed
# corpus and for KOLO_FUZZ_SECONDS (5) more under ctest; a crash fails the step.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
CC=clang CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DKOLO_FUZZ=ON -DCMAKE_BUILD_TYPE=Release \
  -DKOLO_WITH_MPI=OFF -DKOLO_BUILD_TESTS=OFF -DKOLO_FUZZ_SECONDS="${KOLO_FUZZ_SECONDS:-5}" >/dev/null
cmake --build build/fuzz -j "$jobs"
ctest --test-dir build/fuzz -j "$jobs" --output-on-failure
