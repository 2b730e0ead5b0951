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
# `lm` (the largest model, 867,072 parameters; trained by the model-parallel runner) logs no
# state line: its rows give rank 0's `peak tensors` (the bytes alive before a step plus the
# step's peak over them, MiB with two decimals) for plain DP (--mesh dp=N),
# ZeRO-2 and ZeRO-3, at global batch LM_BATCH for LM_STEPS steps.
# Usage: bench/fsdp_memory.sh [BUILD_DIR]   (default build/release)
#   MODELS="mlp cnn"  RANKS="1 2 4"  STEPS=20  BATCH=128  (MODELS="mlp cnn lm": LM_BATCH=16 LM_STEPS=3)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "fsdp_memory: $kolo not built" >&2; exit 1; }
models=${MODELS:-"mlp cnn"}
ranks=${RANKS:-"1 2 4"}
steps=${STEPS:-20}
batch=${BATCH:-128}
lm_batch=${LM_BATCH:-16}
lm_steps=${LM_STEPS:-3}
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

# "- peak_bytes" of rank 0 for the lm on ranks $1 with strategy flags $2.
measure_lm() {
  out=$("$kolo" train --workers "$1" --threads 1 --prefetch off --model lm --optimizer adamw \
    --batch "$lm_batch" --steps "$lm_steps" --seed 1 $2 2>&1) || { echo "$out" >&2; exit 1; }
  line=$(echo "$out" | grep -E '(rank|stage) 0: .*peak tensors' | tail -n 1)
  [ -n "$line" ] || { echo "fsdp_memory: no peak tensors line in:" >&2; echo "$out" >&2; exit 1; }
  mib=$(echo "$line" | sed 's/.*peak tensors \([0-9.]*\) MiB.*/\1/')
  echo "- $(awk -v m="$mib" 'BEGIN { printf "%d", m * 1048576 }')"
}

rows=""
for m in $models; do
  for n in $ranks; do
    methods="dp zero2 zero3 zero3-1u"
    [ "$m" = lm ] && methods="dp zero2 zero3"
    for s in $methods; do
      if [ "$m" = lm ]; then
        case $s in
          dp) flags="--mesh dp=$n" ;;
          zero2) flags="--strategy fsdp --shard grad" ;;
          zero3) flags="--strategy fsdp --shard full" ;;
        esac
        r=$(measure_lm "$n" "$flags")
        echo "run lm n=$n $s: peak bytes $r" >&2
        rows="$rows
$m $n $s $r"
        continue
      fi
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
      if (f[4] == "-")  # no state figure (lm)
        printf "%-5s %2d %-8s %14s %14s %13s %14d %12.2f\n", f[1], f[2], f[3], "-", "-", "-",
          f[5], f[5] / peak[key, "dp"]
      else
        printf "%-5s %2d %-8s %14d %14.2f %13.2f %14d %12.2f\n", f[1], f[2], f[3], f[4],
          f[4] / (one[f[1]] / f[2]), f[4] / state[key, "dp"], f[5], f[5] / peak[key, "dp"]
    }
  }'
