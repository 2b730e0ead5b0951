#!/bin/sh
# Runs kolo's single-step benchmark and its PyTorch peer in one invocation, both on one
# thread, and prints kolo's median step time over PyTorch's per model.
# Usage: bench/train_step.sh [BUILD_DIR] [mlp] [cnn]   (BUILD_DIR defaults to build/release)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
[ $# -gt 0 ] && shift
models=${*:-"mlp cnn"}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
kolo_out=$("$build/bench/train_step" $models)
torch_out=$(/usr/bin/python3 "$here/peers/torch_single_step.py" $models)
echo "$kolo_out"
echo "$torch_out"
for m in $models; do
  k=$(echo "$kolo_out" | grep "\"model\": \"$m\"" | sed 's/.*"step_ms_median": \([0-9.]*\).*/\1/')
  t=$(echo "$torch_out" | grep "\"model\": \"$m\"" | sed 's/.*"step_ms_median": \([0-9.]*\).*/\1/')
  awk -v m="$m" -v k="$k" -v t="$t" \
    'BEGIN { printf "%s: kolo %.3f ms, PyTorch %.3f ms, kolo/PyTorch = %.2fx\n", m, k, t, k / t }'
done
