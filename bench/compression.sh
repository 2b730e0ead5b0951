#!/bin/sh
# Gradient compression in one invocation: `kolo train --model mlp` (multi-worker-mirrored, one
# thread per rank, every method through the same all-reduce path: --shard-optimizer off) for
# each --compress method. First the accuracy: one run of EPOCHS epochs per method on RANKS
# ranks over loopback, its test accuracy and the bytes each rank hands to gradient
# collectives per step (Reducer::bytesSent: the payload, not the algorithm's traffic; the
# average over the run, PowerSGD's first 10 plain steps included). Then the throughput:
# REPEAT rounds of STEPS steps per method, the methods alternating within a round so that a
# change in machine load hits them alike, best steady-state global samples/s of the rounds
# (first 20 steps skipped).
#
# Without SHAPED the throughput runs are on loopback too, where the network is fast: they
# show what compression costs. SHAPED=1 runs them between two hosts instead (network
# namespaces joined by a bridge, tests/comm_multihost/netns_hosts.sh; needs root), 2 ranks on
# each (kolo run --nnodes 2 in each namespace), every host's egress shaped with tbf at each
# rate of RATES, and adds the bytes on the wire per step: what host 1's link carried (both
# directions, its eth0 counters) during a run of STEPS steps minus a run of 11 steps (set-up,
# the first broadcast, evaluation and PowerSGD's plain warm-up steps cancel), over
# STEPS - 11. Its accuracy runs use RANKS=4 on loopback: the same ranks computing the same
# sums, so the same accuracy as across the link.
# Usage: bench/compression.sh [BUILD_DIR]   (default build/release)
#   METHODS="none fp16 bf16 powersgd:4 topk:0.01"  EPOCHS=5  STEPS=400  REPEAT=3  RANKS=2
#   SHAPED=1  RATES="1gbit 10gbit"  (SHAPED defaults: RANKS=4 STEPS=200 REPEAT=2 RATES=1gbit)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "compression: $kolo not built" >&2; exit 1; }
methods=${METHODS:-"none fp16 bf16 powersgd:4 topk:0.01"}
epochs=${EPOCHS:-5}
shaped=${SHAPED:-0}
if [ "$shaped" = 1 ]; then
  steps=${STEPS:-200}
  repeat=${REPEAT:-2}
  ranks=${RANKS:-4}
else
  steps=${STEPS:-400}
  repeat=${REPEAT:-3}
  ranks=${RANKS:-2}
fi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# The summary line of one run of method $1 with further flags $2.
train() {
  out=$("$kolo" train --workers "$ranks" --strategy multi-worker-mirrored --threads 1 \
    --prefetch off --shard-optimizer off --model mlp --seed 1 --compress "$1" $2 --quiet 2>&1) ||
    { echo "$out" >&2; exit 1; }
  echo "$out" | grep 'test_accuracy .* grad_bytes_per_step' | tail -n 1
}
field() { echo "$1" | sed "s/.* $2 \([0-9.]*\).*/\1/; s/^$2 \([0-9.]*\).*/\1/"; }

accuracy=""
for m in $methods; do
  line=$(train "$m" "--epochs $epochs")
  echo "accuracy run $m: $line" >&2
  accuracy="$accuracy
$m $(field "$line" test_accuracy) $(field "$line" grad_bytes_per_step)"
done
if [ "$shaped" = 1 ]; then
  METHODS="$methods" STEPS="$steps" REPEAT="$repeat" exec "$here/compression_shaped.sh" "$kolo" "$accuracy"
fi

rates=""
i=0
while [ $i -lt "$repeat" ]; do
  for m in $methods; do
    line=$(train "$m" "--steps $steps")
    echo "throughput run $m: $(field "$line" steady_samples_per_s) samples/s" >&2
    rates="$rates
$m $(field "$line" steady_samples_per_s)"
  done
  i=$((i + 1))
done

printf "%-12s %9s %16s %14s %10s %10s\n" method "accuracy" "bytes/step/rank" "bytes vs none" \
  "samples/s" "vs none"
echo "$accuracy$rates" | awk '
  NF == 3 { acc[$1] = $2; bytes[$1] = $3; order[++n] = $1 }
  NF == 2 { if ($2 + 0 > best[$1] + 0) best[$1] = $2 }
  END {
    b = order[1]
    for (i = 1; i <= n; i++) {
      m = order[i]
      ratio = (bytes[m] > 0) ? bytes[b] / bytes[m] : 0
      speed = (best[b] > 0) ? best[m] / best[b] : 0
      printf "%-12s %9s %16.0f %13.1fx %10.0f %9.2fx\n", m, acc[m], bytes[m], ratio, best[m], speed
    }
  }'
