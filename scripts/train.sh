#!/usr/bin/env bash
# Installs dependencies, builds kolo and runs the main job: data-parallel training of the
# MLP on Fashion-MNIST with 2 ranks on this machine. Extra arguments go to `kolo train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target kolo
exec ./build/release/src/cli/kolo run -n 2 -- ./build/release/src/cli/kolo train \
  --strategy multi-worker-mirrored --model mlp "$@"
