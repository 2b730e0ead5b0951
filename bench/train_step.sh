#!/bin/sh
# Runs kolo's single-step benchmark and its PyTorch peer in one invocation, both on one
# thread, and prints kolo's median step time over PyTorch's per model.
# Usage: bench/train_step.sh [BUILD_DIR] [--batch B] [mlp] [cnn] [resnet]
#   BUILD_DIR defaults to build/release; B to 128 (64 is what each of 2 data-parallel
#   ranks computes for a global batch of 128).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build/release"
if [ $# -gt 0 ] && [ "$1" != "--batch" ]; then
  build=$1
  shift
fi
batch=128
if [ $# -gt 1 ] && [ "$1" = "--batch" ]; then
  batch=$2
  shift 2
fi
models=${*:-"mlp cnn"}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
kolo_out=$("$build/bench/train_step" --batch "$batch" $models)
torch_out=$(/usr/bin/python3 "$here/peers/torch_single_step.py" --batch "$batch" $models)
echo "$kolo_out"
echo "$torch_out"
for m in $models; do
  k=$(echo "$kolo_out" | grep "\"model\": \"$m\"" | sed 's/.*"step_ms_median": \([0-9.]*\).*/\1/')
  t=$(echo "$torch_out" | grep "\"model\": \"$m\"" | sed 's/.*"step_ms_median": \([0-9.]*\).*/\1/')
  awk -v m="$m" -v b="$batch" -v k="$k" -v t="$t" \
    'BEGIN { printf "%s (batch %d): kolo %.3f ms, PyTorch %.3f ms, kolo/PyTorch = %.2fx\n", m, b, k, t, k / t }'
done
