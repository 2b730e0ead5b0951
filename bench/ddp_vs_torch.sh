#!/bin/sh
# Data-parallel training throughput of kolo against PyTorch 1.13 DDP (gloo) in one
# invocation: both train the same model with the same recipe (SGD, momentum 0.9, global
# batch 128) at 1 and 2 ranks, one thread per rank (kolo with --prefetch off: no loader
# thread), on mlp and cnn, and both report the steady-state global samples/s (first 20
# steps skipped). Prints kolo/PyTorch per rank count and the scaling efficiency 1 -> 2
# ranks (throughput_2 / (2 * throughput_1)).
# Usage: bench/ddp_vs_torch.sh [BUILD_DIR]   (default build/release)
#   MODELS="mlp cnn"  MLP_STEPS=300  CNN_STEPS=120  RESNET_STEPS=60  RANKS="1 2"  REPEAT=1 (best of REPEAT)
#   SYNC_BN=1 (kolo's resnet with synchronised batch norm: MODELS=resnet RANKS=2 SYNC_BN=1)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "ddp_vs_torch: $kolo not built" >&2; exit 1; }
models=${MODELS:-"mlp cnn"}
ranks=${RANKS:-"1 2"}
repeat=${REPEAT:-1}
# SYNC_BN=1: kolo with --sync-bn. The peer keeps plain BatchNorm2d (each rank its own half's
# statistics, no all-reduce in forward or backward: less work than kolo's): PyTorch 1.13's
# SyncBatchNorm refuses CPU modules.
sync_bn=""
[ "${SYNC_BN:-0}" = 1 ] && sync_bn="--sync-bn"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# glibc's malloc on transparent huge pages, as `kolo run` starts its ranks (KOLO_HUGE_PAGES);
# the peer gets the same.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}

# Lines "model ranks torch kolo", one per run; the rank counts alternate within a repeat so
# that a change in machine load hits the 1- and the 2-rank figures alike.
runs=""
for m in $models; do
  case $m in
    mlp) steps=${MLP_STEPS:-300}; lr=0.05 ;;
    cnn) steps=${CNN_STEPS:-120}; lr=0.02 ;;
    resnet) steps=${RESNET_STEPS:-60}; lr=0.05 ;;
    *) echo "ddp_vs_torch: unknown model $m" >&2; exit 1 ;;
  esac
  i=0
  while [ $i -lt "$repeat" ]; do
    for n in $ranks; do
      # PyTorch, then kolo, back to back.
      t_line=$(/usr/bin/python3 "$here/peers/torch_ddp_fmnist.py" --model "$m" --nprocs "$n" \
        --steps "$steps" | tail -n 1)
      t=$(echo "$t_line" | sed 's/.*"samples_per_s": \([0-9.]*\).*/\1/')
      # One thread per rank, as the peer: the batches are gathered on the training thread.
      k_out=$("$kolo" train --workers "$n" --strategy multi-worker-mirrored --threads 1 \
        --prefetch off --model "$m" --batch 128 --optimizer sgd --lr "$lr" --momentum 0.9 \
        --steps "$steps" --timing-skip 20 --quiet $sync_bn 2>&1) || { echo "$k_out" >&2; exit 1; }
      k=$(echo "$k_out" | grep -o 'steady_samples_per_s [0-9.]*' | tail -n 1 | cut -d' ' -f2)
      echo "$m np=$n: PyTorch DDP $t samples/s, kolo $k samples/s" >&2
      runs="$runs
$m $n $t $k"
    done
    i=$((i + 1))
  done
done

# Best of the repeats per model and rank count, in the order first seen.
results=$(echo "$runs" | awk 'NF == 4 {
    key = $1 " " $2
    if (!(key in t)) order[++n] = key
    if ($3 + 0 > t[key] + 0) t[key] = $3
    if ($4 + 0 > k[key] + 0) k[key] = $4
  }
  END { for (i = 1; i <= n; i++) print order[i], t[order[i]], k[order[i]] }')

echo "$results" | awk '
  NF == 4 { t[$1, $2] = $3; k[$1, $2] = $4; if (!($1 in seen)) { seen[$1] = 1; order[++nm] = $1 }
            if (!($2 in rs)) { rs[$2] = 1; rorder[++nr] = $2 } }
  END {
    printf "%-4s %5s %14s %14s %12s\n", "model", "ranks", "PyTorch DDP/s", "kolo/s", "kolo/PyTorch"
    for (i = 1; i <= nm; i++) {
      m = order[i]
      for (j = 1; j <= nr; j++) {
        n = rorder[j]
        if (!((m, n) in t)) continue
        printf "%-5s %5s %14.0f %14.0f %11.2fx\n", m, n, t[m, n], k[m, n], k[m, n] / t[m, n]
      }
      if (((m, 1) in k) && ((m, 2) in k))
        printf "%-5s scaling efficiency 1->2 ranks: kolo %.0f%%, PyTorch DDP %.0f%%\n", m,
               100 * k[m, 2] / (2 * k[m, 1]), 100 * t[m, 2] / (2 * t[m, 1])
    }
  }'
