#!/bin/sh
# Gradient compression on loopback in one invocation: `kolo train --model mlp` on 2 ranks
# (multi-worker-mirrored, one thread each) for each --compress method, reporting the test
# accuracy after EPOCHS epochs, the steady-state global samples/s (first 20 steps skipped)
# and the bytes each rank hands to gradient collectives per step (Reducer::bytesSent: the
# payload, not the algorithm's traffic). On loopback the network is fast, so this shows what
# compression costs; its gain needs a slow link (docs/efficiency.md).
# Usage: bench/compression.sh [BUILD_DIR]   (default build/release)
#   METHODS="none fp16 bf16 powersgd:4 topk:0.01"  EPOCHS=5  RANKS=2  DATA=data/fashion-mnist
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "compression: $kolo not built" >&2; exit 1; }
methods=${METHODS:-"none fp16 bf16 powersgd:4 topk:0.01"}
epochs=${EPOCHS:-5}
ranks=${RANKS:-2}
data=${DATA:-}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

printf "%-12s %9s %14s %16s %12s\n" method accuracy samples/s "bytes/step/rank" "vs none"
base=""
for m in $methods; do
  out=$("$kolo" train --workers "$ranks" --strategy multi-worker-mirrored --threads 1 \
    --prefetch off --model mlp --epochs "$epochs" --seed 1 --compress "$m" \
    ${data:+--data "$data"} --quiet 2>&1) || { echo "$out" >&2; exit 1; }
  line=$(echo "$out" | grep '^test_accuracy' | tail -n 1)
  acc=$(echo "$line" | sed 's/.*test_accuracy \([0-9.]*\).*/\1/')
  rate=$(echo "$line" | sed 's/.*steady_samples_per_s \([0-9.]*\).*/\1/')
  bytes=$(echo "$line" | sed 's/.*grad_bytes_per_step \([0-9.]*\).*/\1/')
  [ -n "$base" ] || base=$bytes
  printf "%-12s %9s %14s %16s %11.1fx\n" "$m" "$acc" "$rate" "$bytes" \
    "$(echo "$base $bytes" | awk '{ print ($2 > 0 ? $1 / $2 : 0) }')"
done
