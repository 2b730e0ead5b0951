#!/bin/sh
# The default `lm` under `--strategy tensor --tp 2`, split by the tensor-parallel plan
# (parallel::defaultPlan), against another build of kolo given as BASELINE (e.g. one built
# from main's commit 2c9db7e, where tensor_parallel.cc special-cased kolo's own layer types),
# alternating the two ROUNDS times in one invocation so that a busy machine slows both alike.
# Prints each build's best step time (kolo train's step_ms, after --timing-skip steps) and
# their ratio, then the start line's per-rank parameter share of this build for T = 2 and 4
# (4 ranks oversubscribe a 2-core machine: the share, not the speed, counts there).
# Usage: BASELINE=/path/to/old/kolo bench/tp_plan.sh [BUILD_DIR]   (default build/release)
#   ROUNDS=3 STEPS=24 and the lm's flags in LM (default: the lm's default size)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "tp_plan: $kolo not built" >&2; exit 1; }
baseline=${BASELINE:-}
rounds=${ROUNDS:-3} steps=${STEPS:-24}
lm=${LM:-"--model lm"}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
flags="$lm --strategy tensor --tp 2 --steps $steps --timing-skip 4 --sample-bytes 0 --threads 1"
step_ms() { grep -o 'step_ms [0-9.]*' | tail -n 1 | cut -d' ' -f2; }
lower() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == 0 || b < a) ? b : a }'; }
best_new=0 best_old=0
i=0
while [ "$i" -lt "$rounds" ]; do
  new=$("$kolo" run -n 2 -- "$kolo" train $flags 2>&1 | step_ms)
  echo "plan      round $i: $new ms/step"
  best_new=$(lower "$best_new" "$new")
  if [ -n "$baseline" ]; then
    old=$("$baseline" run -n 2 -- "$baseline" train $flags 2>&1 | step_ms)
    echo "baseline  round $i: $old ms/step"
    best_old=$(lower "$best_old" "$old")
  fi
  i=$((i + 1))
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$baseline" ]; then
  awk -v n="$best_new" -v o="$best_old" \
    'BEGIN { printf "lm --tp 2: plan %.2f ms, baseline %.2f ms, plan/baseline = %.3fx\n", n, o, n / o }'
else
  echo "lm --tp 2: plan $best_new ms/step (no BASELINE given)"
fi
for t in 2 4; do
  line=$("$kolo" run -n "$t" -- "$kolo" train $lm --strategy tensor --tp "$t" --steps 1 --sample-bytes 0 \
    --threads 1 2>&1 | grep 'rank_share' | head -n 1)
  for key in tp_plan tp_modules_split model_parameters rank_parameters rank_share parameters_by_rank; do
    printf '%s ' "$(echo "$line" | grep -o "$key=[^ ]*" | head -n 1)"
  done
  echo "(T = $t)"
done
