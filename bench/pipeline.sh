#!/bin/sh
# Pipeline parallelism against its own ideal: the `lm` split into P = 2 stages (one rank
# each; split before layer SPLIT, default 3 = two blocks a stage; SPLIT=auto: by measured
# layer cost) with M = 4 and 8 micro-batches under GPipe and 1F1B.
# Each run reports, from the stages' own timelines, the compute time of the slowest stage per
# step; the ideal step of the schedule is that × (M + P − 1) / M (the bubble of a perfect
# pipeline with free communication). Prints the measured step time over that ideal, the peak
# micro-batches each stage held and its peak step memory (tensor bytes above the weights,
# gradients and optimizer state: activations, saved tensors, messages), and the unsplit
# model's step on one rank for reference.
# Usage: bench/pipeline.sh [BUILD_DIR]   (default build/release)
#   LAYERS=4 DMODEL=128 HEADS=4 SEQ=64 BATCH=16 STEPS=24 MICRO="4 8"
#   SCHEDULES="gpipe 1f1b 1f1b+recompute" (+recompute adds --recompute)
#   SPLIT=3|auto
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "pipeline: $kolo not built" >&2; exit 1; }
layers=${LAYERS:-4} dmodel=${DMODEL:-128} heads=${HEADS:-4} seq=${SEQ:-64} batch=${BATCH:-16}
steps=${STEPS:-24} micro=${MICRO:-"4 8"} schedules=${SCHEDULES:-"gpipe 1f1b 1f1b+recompute"} split=${SPLIT:-3}
split_flag=""
[ "$split" = auto ] || split_flag="--split-at $split"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
model="--model lm --layers $layers --d-model $dmodel --heads $heads --seq-len $seq --batch $batch \
  --steps $steps --timing-skip 4 --sample-bytes 0 --threads 1"

one=$("$kolo" train $model 2>&1) || { echo "$one" >&2; exit 1; }
one_ms=$(echo "$one" | grep -o 'step_ms [0-9.]*' | cut -d' ' -f2)
echo "lm: $layers layers, d-model $dmodel, $heads heads, seq-len $seq, batch $batch, $steps steps"
echo "one rank, unsplit: $one_ms ms/step; split: $split; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-3s %-3s %-15s %9s %9s %15s  %s\n" P M schedule step_ms ideal_ms measured/ideal \
  "per stage: [layers] compute ms/step, peak micro-batches held, peak step memory"
for m in $micro; do
  for s in $schedules; do
    recompute=""
    case $s in *+recompute) recompute="--recompute" ;; esac
    out=$("$kolo" run -n 2 -- "$kolo" train $model --strategy pipeline --stages 2 $split_flag \
      --micro-batches "$m" --schedule "${s%+recompute}" $recompute 2>&1) || { echo "$out" >&2; exit 1; }
    line=$(echo "$out" | grep 'measured_over_ideal' | tail -n 1)
    stages=$(echo "$out" | grep -o 'stage [0-9]*: layers [0-9-]*  compute [0-9.]* ms/step.*held [0-9]*.*step memory [0-9.]* MiB' |
      sed 's/stage \([0-9]*\): layers \([0-9-]*\)  compute \([0-9.]*\) ms\/step.*held \([0-9]*\).*step memory \([0-9.]*\) MiB/[\2] \3 ms, \4 held, \5 MiB;/' |
      tr '\n' ' ')
    printf "%-3s %-3s %-15s %9s %9s %15s  %s\n" 2 "$m" "$s" \
      "$(echo "$line" | grep -o 'step_ms [0-9.]*' | cut -d' ' -f2)" \
      "$(echo "$line" | grep -o 'ideal_ms [0-9.]*' | cut -d' ' -f2)" \
      "$(echo "$line" | grep -o 'measured_over_ideal [0-9.]*' | cut -d' ' -f2)" "$stages"
  done
done
