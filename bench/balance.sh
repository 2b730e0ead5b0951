#!/usr/bin/env bash
# Load balancing (kolo train --balance) against the ideal and against PyTorch DDP, with
# one rank slowed 2x (--debug-slow-rank 0:2: it sleeps its own compute time again before
# each step). 2 and 4 ranks, mlp, global batch 128, one thread per rank, steady-state
# global samples/s (first 20 steps skipped) of:
#   even      no rank slowed: each rank's own speed is even / N
#   plain     rank 0 slowed, the batch split evenly: every step waits for rank 0
#   balanced  rank 0 slowed, --balance: the split follows the measured speeds
#   torch     PyTorch 1.13 DDP (gloo) with rank 0 slowed the same way (DDP cannot balance)
# The ideal is the sum of the ranks' own speeds, even * (N - 1 + 1/2) / N; plain should be
# near the slowest rank's speed times N, even / 2.
# Usage: bash bench/balance.sh   (STEPS=300 RANKS="2 4" REPEAT=1: best of REPEAT)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kolo=${KOLO:-$here/../build/release/src/cli/kolo}
[ -x "$kolo" ] || { echo "balance: $kolo not built" >&2; exit 1; }
steps=${STEPS:-300}
repeat=${REPEAT:-1}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# Steady samples/s of one kolo run of N ranks with extra options.
kolo_rate() {
  local n=$1; shift
  local out
  out=$("$kolo" train --workers "$n" --strategy multi-worker-mirrored --threads 1 --prefetch off \
    --model mlp --batch 128 --optimizer sgd --lr 0.05 --momentum 0.9 --steps "$steps" \
    --timing-skip 20 --quiet "$@" 2>&1) || { echo "$out" >&2; exit 1; }
  grep -o 'steady_samples_per_s [0-9.]*' <<<"$out" | tail -n 1 | cut -d' ' -f2
}

best() { printf '%s\n' "$@" | sort -g | tail -n 1; }

echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg), $(getconf _NPROCESSORS_ONLN) cores"
printf "%-6s %9s %9s %9s %9s %9s %14s %12s %15s\n" ranks even ideal plain balanced torch \
  balanced/ideal plain/ideal balanced/torch
for n in ${RANKS:-2 4}; do
  even=() plain=() balanced=() torch=()
  for _ in $(seq "$repeat"); do
    even+=("$(kolo_rate "$n")")
    plain+=("$(kolo_rate "$n" --debug-slow-rank 0:2)")
    balanced+=("$(kolo_rate "$n" --debug-slow-rank 0:2 --balance)")
    torch+=("$(/usr/bin/python3 "$here/peers/torch_ddp_fmnist.py" --model mlp --nprocs "$n" \
      --steps "$steps" --slow-rank 0:2 | tail -n 1 | sed 's/.*"samples_per_s": \([0-9.]*\).*/\1/')")
  done
  e=$(best "${even[@]}") p=$(best "${plain[@]}") b=$(best "${balanced[@]}") t=$(best "${torch[@]}")
  awk -v n="$n" -v e="$e" -v p="$p" -v b="$b" -v t="$t" 'BEGIN {
    ideal = e * (n - 0.5) / n
    printf "%-6s %9.0f %9.0f %9.0f %9.0f %9.0f %14.2f %12.2f %15.2f\n", n, e, ideal, p, b, t,
      b / ideal, p / ideal, b / t }'
done
