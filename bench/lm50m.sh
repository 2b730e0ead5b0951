#!/bin/sh
# A 50 M-parameter `lm` on 4 ranks under a per-rank --memory-limit that one rank cannot meet
# (docs/model_parallel.md, "A 50 M-parameter run on 4 ranks"): the same model on one rank
# first (it must end with kolo's memory-limit error, exit code 2), then (a) --strategy fsdp and
# (b) --mesh pp=2,tp=2, one after the other, each writing --metrics; then `kolo report` on
# each run and its loss curve redrawn as a PNG from the report's own gnuplot script.
# Prints each run's figures (peak tensors and rss per rank, step time, loss) and the load.
# Usage: bench/lm50m.sh [BUILD_DIR]   (default build/release)
#   OUT=/tmp/lm50m (runs, reports, PNGs)  LIMIT=512M  STEPS=60  BATCH=8
#   LAYERS=10 DMODEL=640 HEADS=10 SEQ=256  PRECISION=bf16  PLOTS_ONLY=1 (redraw from OUT)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "lm50m: $kolo not built" >&2; exit 1; }
command -v gnuplot >/dev/null || { echo "lm50m: gnuplot is not installed (apt-get install gnuplot-nox)" >&2; exit 1; }
out=${OUT:-/tmp/lm50m} limit=${LIMIT:-512M} steps=${STEPS:-60} batch=${BATCH:-8}
layers=${LAYERS:-10} dmodel=${DMODEL:-640} heads=${HEADS:-10} seq=${SEQ:-256} precision=${PRECISION:-bf16}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
model="--model lm --layers $layers --d-model $dmodel --heads $heads --seq-len $seq --batch $batch \
  --steps $steps --optimizer adamw --lr 1e-3 --schedule warmup-cosine --warmup-steps $((steps / 10)) \
  --precision $precision --memory-limit $limit --metrics-every 1 --sample-bytes 64 --no-progress"
fsdp="--strategy fsdp"
# Stage 0: the embedding and the first half of the blocks; stage 1: the rest, the norm, the head.
mesh="--mesh pp=2,tp=2 --micro-batches 4 --split-at $((layers / 2 + 1))"
mkdir -p "$out"

if [ "${PLOTS_ONLY:-0}" != 1 ]; then
  echo "lm: $layers blocks, d-model $dmodel, $heads heads, seq-len $seq, batch $batch, $steps steps, $precision, limit $limit"
  set +e
  one=$("$kolo" train $model 2>&1)
  rc=$?
  set -e
  [ "$rc" = 2 ] || { echo "lm50m: one rank under --memory-limit $limit exited with $rc, not 2:" >&2; echo "$one" >&2; exit 1; }
  echo "one rank: exit code 2: $(echo "$one" | grep 'memory limit')"
  for run in lm50m-fsdp lm50m-pp2-tp2; do
    flags=$fsdp
    [ "$run" = lm50m-pp2-tp2 ] && flags=$mesh
    rm -rf "${out:?}/$run"
    mkdir -p "$out/$run"
    before=$(cut -d' ' -f1-3 /proc/loadavg)
    start=$(date +%s)
    "$kolo" run -n 4 -- "$kolo" train $model $flags --metrics "$out/$run/metrics.jsonl" > "$out/$run/out.txt" 2>&1 ||
      { tail -n 20 "$out/$run/out.txt" >&2; exit 1; }
    echo "$run: $flags  (wall $(( $(date +%s) - start )) s, load average $before before, $(cut -d' ' -f1-3 /proc/loadavg) after)"
    grep -o '\(stage [0-9] \)\?rank [0-9]: layers [0-9-]*\|step [0-9.]* ms\|peak tensors [0-9.]* MiB\|peak rss [0-9.]* MiB' \
      "$out/$run/out.txt" | paste -d' ' - - - - | sed 's/^/  /'
    grep 'step_ms\|^\[rank 0\] train_loss' "$out/$run/out.txt" | sed 's/^\[rank 0\] /  /'
  done
fi

# The report's loss-against-step plot, redrawn as a PNG by its own gnuplot script.
for run in lm50m-fsdp lm50m-pp2-tp2; do
  "$kolo" report "$out/$run" -o "$out/$run/report" > /dev/null
  sed -e "s|^set terminal svg .*|set terminal pngcairo size 760,380 noenhanced font 'DejaVu Sans,11' background '#ffffff'|" \
      -e "s|^set output .*|set output '$out/$run.png'\nset xrange [0:$steps]\nset title 'train loss per step: $run'|" \
      "$out/$run/report/plots/loss-step.gp" > "$out/$run/loss_png.gp"
  gnuplot "$out/$run/loss_png.gp"
  echo "wrote $out/$run.png ($(wc -c < "$out/$run.png") bytes) and $out/$run/report/index.html"
done
