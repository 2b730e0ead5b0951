#!/bin/sh
# What the observe tools cost, in one invocation: steady-state samples/s of `kolo train`
# (mlp, 2 ranks, multi-worker-mirrored with gradient all-reduces, one thread per rank) with
# the flight recorder off (KOLO_FLIGHT_RECORDER=0), with it on (the default), and with it
# and the timeline (--timeline); then the median time of a 64-byte all-reduce (2 ranks),
# where the recorder's fixed cost per collective shows most, with the recorder off and on.
# Last, the fixed costs per call (bench/trace_cost.cc): a clock read, a span, a flight entry.
# The configurations alternate within each repeat, and the best of REPEAT is kept, so a
# change in machine load hits them alike. Prints each figure and the ratios to "off".
# Usage: bench/timeline_overhead.sh [BUILD_DIR]   (default build/release)
#   STEPS=400  REPEAT=3  RANKS=2
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "timeline_overhead: $kolo not built" >&2; exit 1; }
[ -x "$build/bench/trace_cost" ] || { echo "timeline_overhead: $build/bench/trace_cost not built" >&2; exit 1; }
steps=${STEPS:-400}
repeat=${REPEAT:-3}
ranks=${RANKS:-2}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

train() {  # train FLIGHT_RECORDER [--timeline DIR] -> steady samples/s
  recorder=$1
  shift
  out=$(KOLO_FLIGHT_RECORDER=$recorder "$kolo" train --workers "$ranks" \
    --strategy multi-worker-mirrored --shard-optimizer off --threads 1 --prefetch off \
    --model mlp --batch 128 --optimizer sgd --lr 0.05 --steps "$steps" --timing-skip 20 \
    --quiet "$@" 2>&1) || { echo "$out" >&2; exit 1; }
  echo "$out" | grep -o 'steady_samples_per_s [0-9.]*' | tail -n 1 | cut -d' ' -f2
}

latency() {  # latency FLIGHT_RECORDER -> median microseconds of a 64-byte all-reduce
  KOLO_FLIGHT_RECORDER=$1 "$kolo" bench allreduce --sizes 64 -n 5000 -w 500 --ranks "$ranks" \
    --json | grep -o '"t_median_us":[0-9.]*' | cut -d: -f2
}

best_off=0 best_on=0 best_tl=0
lat_off=1e9 lat_on=1e9
i=0
while [ $i -lt "$repeat" ]; do
  off=$(train 0)
  on=$(train 1024)
  rm -rf "$tmp/timeline"
  tl=$(train 1024 --timeline "$tmp/timeline")
  [ -s "$tmp/timeline/trace.json" ] || { echo "timeline_overhead: no trace.json written" >&2; exit 1; }
  lo=$(latency 0)
  ln=$(latency 1024)
  echo "repeat $((i + 1)): samples/s off $off, recorder $on, recorder+timeline $tl; 64 B all-reduce off $lo us, recorder $ln us" >&2
  best_off=$(echo "$best_off $off" | awk '{print ($2 + 0 > $1 + 0) ? $2 : $1}')
  best_on=$(echo "$best_on $on" | awk '{print ($2 + 0 > $1 + 0) ? $2 : $1}')
  best_tl=$(echo "$best_tl $tl" | awk '{print ($2 + 0 > $1 + 0) ? $2 : $1}')
  lat_off=$(echo "$lat_off $lo" | awk '{print ($2 + 0 < $1 + 0) ? $2 : $1}')
  lat_on=$(echo "$lat_on $ln" | awk '{print ($2 + 0 < $1 + 0) ? $2 : $1}')
  i=$((i + 1))
done
events=$(grep -o '"ph":"X"' "$tmp/timeline/trace.json" | wc -l)

echo "kolo train mlp, $ranks ranks, $steps steps, best of $repeat (steady samples/s):"
echo "$best_off $best_on $best_tl" | awk '{
  printf "  flight recorder off          %10.1f\n", $1
  printf "  flight recorder on           %10.1f   %.4f of off (%+.2f%%)\n", $2, $2 / $1, 100 * ($2 / $1 - 1)
  printf "  recorder + timeline          %10.1f   %.4f of off (%+.2f%%)\n", $3, $3 / $1, 100 * ($3 / $1 - 1)
}'
echo "  timeline spans in trace.json: $events"
echo "per call, one thread (bench/trace_cost):"
"$build/bench/trace_cost" | sed 's/^/  /'
echo "64-byte all-reduce, $ranks ranks, best median of $repeat:"
echo "$lat_off $lat_on" | awk '{
  printf "  flight recorder off          %8.3f us\n", $1
  printf "  flight recorder on           %8.3f us   (%+.3f us per collective)\n", $2, $2 - $1
}'
