#!/bin/sh
# Parameter-server training of kolo against PyTorch's RPC parameter server
# (bench/peers/torch_rpc_ps.py, the pattern of PyTorch's parameter-server tutorials) in one
# invocation: the mlp on Fashion-MNIST, 1 server, 2 workers, batch 64 per worker, SGD lr 0.05
# momentum 0.9 on the server, 3 epochs' worth of samples (180,000), in sync and async mode.
# Prints samples/s (all workers together) and test accuracy of each, and kolo/PyTorch. Then,
# with STRAGGLER=1 (the default), kolo alone with worker 0 slowed 2x (--debug-slow-worker
# 0:2) in sync, async and ssp (--staleness 2): samples/s over sync's and the accuracy each
# reached on the same number of samples. kolo's sync runs the peer's optimizer (SGD lr 0.05
# momentum 0.9) with kolo's cosine decay of the rate (--schedule cosine; SYNC_SCHEDULE=constant
# runs the peer's constant rate); a second sync row, "sync-const", is kolo with the peer's
# constant rate, whose last-epoch accuracy moves by about a point either way with the data
# order. kolo's async and ssp runs take kolo's defaults for those modes (Adam lr 1e-3, cosine;
# the exchange overlapped with compute), as the peer's recipe with stale gradients does not
# train well. Every kolo run starts from the peer's initial weights
# (bench/peers/torch_initial_weights.py, --init).
# Rates are steady ones on both sides: the peer counts each worker's samples from its 11th step,
# kolo those of the epochs after the first (steady_samples_per_s).
# Usage: bench/ps_vs_torch.sh [BUILD_DIR]   (default build/release)
#   MODES="sync async"  EPOCHS=3  WORKERS=2  BIND=none|core (kolo run --bind)  STRAGGLER=1
#   SYNC_SCHEDULE=cosine|constant
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "ps_vs_torch: $kolo not built" >&2; exit 1; }
modes=${MODES:-"sync async"}
epochs=${EPOCHS:-3}
workers=${WORKERS:-2}
bind=${BIND:-none}
sync_schedule=${SYNC_SCHEDULE:-cosine}
samples=$((epochs * 60000))
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# glibc's malloc on transparent huge pages, as `kolo run` starts its ranks (KOLO_HUGE_PAGES);
# the peer gets the same.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
init="$work/torch_init.safetensors"
/usr/bin/python3 "$here/peers/torch_initial_weights.py" --model mlp "$init"

# kolo's summary line -> "steady_samples_per_s test_accuracy"
# kolo_run MODE ARGS...
kolo_run() {
  mode=$1
  shift
  recipe=""
  [ "$mode" = sync ] && recipe="--optimizer sgd --lr 0.05 --momentum 0.9 --schedule $sync_schedule"
  # shellcheck disable=SC2086
  # --batch is the global batch (a step's samples): 64 a push is 64 in async and ssp, 64 x W
  # in sync, where a step is one push of every worker.
  batch=64
  [ "$mode" = sync ] && batch=$((64 * workers))
  out=$("$kolo" run --bind "$bind" --ps 1 --workers "$workers" -- "$kolo" train \
    --strategy parameter-server --ps-mode "$mode" --model mlp --batch "$batch" $recipe \
    --epochs "$epochs" --threads 1 --init "$init" --quiet "$@" 2>&1) || { echo "$out" >&2; exit 1; }
  line=$(echo "$out" | grep 'test_accuracy' | tail -n 1)
  echo "$(echo "$line" | grep -o 'steady_samples_per_s [0-9.]*' | cut -d' ' -f2)" \
       "$(echo "$line" | grep -o 'test_accuracy [0-9.]*' | cut -d' ' -f2)"
}

rows=""
for mode in $modes; do
  # PyTorch, then kolo, back to back.
  t_line=$(/usr/bin/python3 "$here/peers/torch_rpc_ps.py" --mode "$mode" --workers "$workers" \
    --model mlp --batch 64 --samples "$samples" | tail -n 1)
  t_rate=$(echo "$t_line" | sed 's/.*"samples_per_s": \([0-9.]*\).*/\1/')
  t_acc=$(echo "$t_line" | sed 's/.*"test_accuracy": \([0-9.]*\).*/\1/')
  set -- $(kolo_run "$mode")
  [ $# -eq 2 ] || exit 1
  k_rate=$1 k_acc=$2
  echo "$mode: PyTorch RPC $t_rate samples/s acc $t_acc; kolo $k_rate samples/s acc $k_acc" >&2
  rows="$rows
$mode $t_rate $t_acc $k_rate $k_acc"
  if [ "$mode" = sync ] && [ "$sync_schedule" != constant ]; then
    set -- $(sync_schedule=constant kolo_run sync)
    [ $# -eq 2 ] || exit 1
    echo "sync, the peer's constant rate: kolo $1 samples/s acc $2" >&2
    rows="$rows
sync-const $t_rate $t_acc $1 $2"
  fi
done

echo "$rows" | awk 'NF == 5 {
    if (!header++) printf "%-10s %16s %9s %12s %9s %13s\n", "mode", "PyTorch RPC/s", "acc", "kolo/s",
                          "acc", "kolo/PyTorch"
    printf "%-10s %16.0f %9.4f %12.0f %9.4f %12.2fx\n", $1, $2, $3, $4, $5, $4 / $2
  }'

[ "${STRAGGLER:-1}" = 1 ] || exit 0
slow=""
for mode in sync async ssp; do
  set -- $(kolo_run "$mode" --staleness 2 --debug-slow-worker 0:2)
  [ $# -eq 2 ] || exit 1
  echo "$mode, worker 0 slowed 2x: kolo $1 samples/s acc $2" >&2
  slow="$slow
$mode $1 $2"
done
echo
echo "worker 0 slowed 2x (kolo, $epochs epochs' samples):"
echo "$slow" | awk 'NF == 3 {
    if (!header++) printf "%-6s %12s %9s %10s\n", "mode", "kolo/s", "acc", "vs sync"
    if ($1 == "sync") base = $2
    printf "%-6s %12.0f %9.4f %9.2fx\n", $1, $2, $3, $2 / base
  }'
