#!/bin/sh
# The resnet of issue #42 (kolo train --model resnet) against PyTorch, in one invocation:
#  1. 9 SGD steps (batch 32, lr 0.05, momentum 0.9) in file order from PyTorch's initial
#     state (torch.manual_seed(0)): kolo on one device against PyTorch's same steps; 2 ranks
#     with --sync-bn against one PyTorch process on the global batch; 2 ranks without it
#     against the same (each rank then normalises with its own half: it is expected to
#     differ). Each line gives the worst relative difference over every state entry, running
#     statistics included (max |kolo - torch| / max |torch| per tensor); and, as the floor
#     of what f32 can agree to here, PyTorch f32 and kolo one device against PyTorch in f64
#     (a batch norm's bias is a sum of its output gradient, which nearly cancels: its f32
#     rounding grows over the steps in any implementation).
#  2. Step time on one thread at batch 128 (bench/train_step.sh resnet).
#  3. 2-rank samples/s, kolo with --sync-bn, against PyTorch DDP over gloo
#     (bench/ddp_vs_torch.sh with MODELS=resnet RANKS=2 SYNC_BN=1). PyTorch 1.13's
#     SyncBatchNorm refuses CPU modules, so the peer's batch norms are plain ones: each rank
#     normalises its own half, with no all-reduce in forward or backward.
# Usage: bench/resnet.sh [BUILD_DIR]   (default build/release)   PARTS="1 2 3"
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-"$here/../build/release"}
kolo="$build/src/cli/kolo"
[ -x "$kolo" ] || { echo "resnet: $kolo not built" >&2; exit 1; }
parts=${PARTS:-"1 2 3"}
peer="$here/peers/torch_resnet.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

steps="--steps 9 --batch 32 --lr 0.05 --momentum 0.9"
kolo_steps() {  # kolo train's 9 steps with extra flags $1, the final state to $2
  # shellcheck disable=SC2086
  "$kolo" train --model resnet --init "$tmp/init.safetensors" --no-shuffle --train-limit 288 $steps \
    --optimizer sgd --threads 1 --prefetch off --quiet --save "$2" $1 >"$tmp/out.txt" 2>&1 ||
    { cat "$tmp/out.txt" >&2; exit 1; }
}
for part in $parts; do
  case $part in
    1)
      /usr/bin/python3 "$peer" init "$tmp/init.safetensors"
      # shellcheck disable=SC2086
      /usr/bin/python3 "$peer" steps --init "$tmp/init.safetensors" --out "$tmp/torch.safetensors" $steps
      # shellcheck disable=SC2086
      /usr/bin/python3 "$peer" steps --init "$tmp/init.safetensors" --out "$tmp/torch64.safetensors" $steps --double
      kolo_steps "" "$tmp/one.safetensors"
      kolo_steps "--workers 2 --sync-bn" "$tmp/sync.safetensors"
      kolo_steps "--workers 2" "$tmp/local.safetensors"
      for run in one sync local; do
        case $run in
          one) what="kolo one device      vs PyTorch one process" ;;
          sync) what="kolo 2 ranks --sync-bn vs PyTorch one process" ;;
          local) what="kolo 2 ranks (own BN) vs PyTorch one process" ;;
        esac
        echo "$what: $(/usr/bin/python3 "$peer" compare "$tmp/$run.safetensors" "$tmp/torch.safetensors")"
      done
      compare() { /usr/bin/python3 "$peer" compare "$tmp/$1.safetensors" "$tmp/$2.safetensors"; }
      echo "kolo 2 ranks --sync-bn vs kolo one device:    $(compare sync one)"
      echo "PyTorch f32 vs PyTorch f64:                   $(compare torch torch64)"
      echo "kolo one device vs PyTorch f64:               $(compare one torch64)"
      ;;
    2) "$here/train_step.sh" "$build" resnet ;;
    3) MODELS=resnet RANKS=2 SYNC_BN=1 "$here/ddp_vs_torch.sh" "$build" ;;
    *) echo "resnet: unknown part $part" >&2; exit 1 ;;
  esac
done
