#!/bin/sh
# Tensor memory per rank of plain data parallelism, ZeRO-2 and ZeRO-3 in one invocation:
# `kolo train --optimizer adamw` of each model on N = 1, 2, 4 ranks for STEPS steps, with
# --strategy multi-worker-mirrored --shard-optimizer off (plain DP: every rank holds the
# whole parameters, gradients and optimizer state), --strategy fsdp --shard grad (ZeRO-2) and
# --shard full (ZeRO-3, a unit per layer; zero3-1u: --unit-params 10^9, the whole model one
# unit). Each run logs rank 0's `tensor memory` line (kolo/memory.h's
# process-wide accounting, the data set left out): state_bytes, what a step leaves alive
# besides its batch (the model state: parameters, gradients, optimizer state, the
# strategy's buffers), and step_peak_bytes, the most alive at once during a step
# (activations, the batch and communication buffers included). The loader runs on the
# training thread (--prefetch off), so no further batch is alive. The table gives both and
# their ratio to plain DP at the same N (state: to DP's at N = 1 divided by N, the ideal).
# Usage: bench/fsdp_memory.sh [BUILD_DIR]   (default build/release)
#   MODELS="mlp cnn"  RANKS="1 2 4"  STEPS=20  BATCH=128
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "fsdp_memory: $kolo not built" >&2; exit 1; }
models=${MODELS:-"mlp cnn"}
ranks=${RANKS:-"1 2 4"}
steps=${STEPS:-20}
batch=${BATCH:-128}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# state_bytes and step_peak_bytes of rank 0 for model $1, ranks $2, strategy flags $3.
measure() {
  out=$("$kolo" train --workers "$2" --threads 1 --prefetch off --model "$1" --optimizer adamw \
    --batch "$batch" --steps "$steps" --seed 1 $3 2>&1) || { echo "$out" >&2; exit 1; }
  line=$(echo "$out" | grep 'tensor memory' | grep -E 'rank[^0-9]+0([^0-9]|$)' | tail -n 1)
  [ -n "$line" ] || { echo "fsdp_memory: no tensor memory line in:" >&2; echo "$out" >&2; exit 1; }
  state=$(echo "$line" | sed 's/.*state_bytes[^0-9]*\([0-9]*\).*/\1/')
  peak=$(echo "$line" | sed 's/.*step_peak_bytes[^0-9]*\([0-9]*\).*/\1/')
  echo "$state $peak"
}

rows=""
for m in $models; do
  for n in $ranks; do
    for s in dp zero2 zero3 zero3-1u; do
      case $s in
        dp) flags="--strategy multi-worker-mirrored --shard-optimizer off" ;;
        zero2) flags="--strategy fsdp --shard grad" ;;
        zero3) flags="--strategy fsdp --shard full" ;;
        zero3-1u) flags="--strategy fsdp --shard full --unit-params 1000000000" ;;
      esac
      r=$(measure "$m" "$n" "$flags")
      echo "run $m n=$n $s: state/peak bytes $r" >&2
      rows="$rows
$m $n $s $r"
    done
  done
done

printf "%-5s %2s %-8s %14s %14s %13s %14s %12s\n" model N method "state bytes" "vs DP(1)/N" \
  "state vs DP" "peak bytes" "peak vs DP"
echo "$rows" | awk '
  NF == 5 { key = $1 " " $2; state[key, $3] = $4; peak[key, $3] = $5; row[++n] = $0
            if ($2 == 1 && $3 == "dp") one[$1] = $4 }
  END {
    for (i = 1; i <= n; ++i) {
      split(row[i], f, " "); key = f[1] " " f[2]
      printf "%-5s %2d %-8s %14d %14.2f %13.2f %14d %12.2f\n", f[1], f[2], f[3], f[4],
        f[4] / (one[f[1]] / f[2]), f[4] / state[key, "dp"], f[5], f[5] / peak[key, "dp"]
    }
  }'
