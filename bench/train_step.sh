#!/bin/sh
# Runs kolo's single-step benchmark and its PyTorch peer in one invocation, both on one
# thread, and prints kolo's median step time over PyTorch's per model, of wall time and of
# CPU time (on a machine shared with other work the wall time also counts the waits for a
# core).
# Usage: bench/train_step.sh [BUILD_DIR] [--batch B] [mlp] [cnn] [resnet]
#   BUILD_DIR defaults to build/release; B to 128 (64 is what each of 2 data-parallel
#   ranks computes for a global batch of 128).
#   ROUNDS=N (default 1): kolo and PyTorch alternate N times, and each model's last line gives
#   the ratios' median and range over the rounds.
#   BEFORE=PATH: another build's bench/train_step also runs in every round, its ratios to
#   PyTorch and kolo's to it (after/before) printed alike.
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
rounds=${ROUNDS:-1}
before=${BEFORE:-}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
field() {  # field NAME MODEL: NAME's value on MODEL's JSON line of stdin
  grep "\"model\": \"$2\"" | sed "s/.*\"$1\": \([0-9.]*\).*/\1/"
}
table=$(mktemp)
trap 'rm -f "$table"' EXIT
round=1
while [ "$round" -le "$rounds" ]; do
  # shellcheck disable=SC2086
  kolo_out=$("$build/bench/train_step" --batch "$batch" $models)
  # shellcheck disable=SC2086
  torch_out=$(/usr/bin/python3 "$here/peers/torch_single_step.py" --batch "$batch" $models)
  before_out=""
  # shellcheck disable=SC2086
  [ -n "$before" ] && before_out=$("$before" --batch "$batch" $models)
  echo "$kolo_out"
  echo "$torch_out"
  [ -n "$before_out" ] && echo "$before_out" | sed 's/"kolo_train_step"/"kolo_train_step_before"/'
  for m in $models; do
    k=$(echo "$kolo_out" | field step_ms_median "$m")
    kc=$(echo "$kolo_out" | field cpu_ms_median "$m")
    t=$(echo "$torch_out" | field step_ms_median "$m")
    tc=$(echo "$torch_out" | field cpu_ms_median "$m")
    b=0 bc=0
    if [ -n "$before_out" ]; then
      b=$(echo "$before_out" | field step_ms_median "$m")
      bc=$(echo "$before_out" | field cpu_ms_median "$m")
    fi
    echo "$m $k $kc $t $tc $b $bc" >>"$table"
    awk -v m="$m" -v bt="$batch" -v k="$k" -v kc="$kc" -v t="$t" -v tc="$tc" -v b="$b" -v bc="$bc" 'BEGIN {
      printf "%s (batch %d): kolo %.3f ms (CPU %.3f), PyTorch %.3f ms (CPU %.3f), kolo/PyTorch = %.2fx (CPU %.2fx)",
        m, bt, k, kc, t, tc, k / t, kc / tc
      if (b > 0) printf "; before %.3f ms (CPU %.3f), after/before = %.2fx (CPU %.2fx)", b, bc, k / b, kc / bc
      printf "\n" }'
  done
  round=$((round + 1))
done
[ "$rounds" -gt 1 ] || exit 0
for m in $models; do
  grep "^$m " "$table" | awk -v m="$m" -v n="$rounds" '
    function med(a, k,   i, j, x) {
      for (i = 2; i <= k; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    { w[NR] = $2 / $4; c[NR] = $3 / $5; if ($6 > 0) { bw[NR] = $2 / $6; bc[NR] = $3 / $7; before = 1 } }
    END {
      mw = med(w, n); mc = med(c, n)  # med sorts: [1] and [n] are then the range
      printf "%s over %d rounds: kolo/PyTorch median %.2fx (%.2f-%.2f), CPU %.2fx (%.2f-%.2f)", m, n,
        mw, w[1], w[n], mc, c[1], c[n]
      if (before) {
        mbw = med(bw, n); mbc = med(bc, n)
        printf "; after/before median %.2fx (%.2f-%.2f), CPU %.2fx (%.2f-%.2f)", mbw, bw[1], bw[n], mbc, bc[1], bc[n]
      }
      printf "\n" }'
done
