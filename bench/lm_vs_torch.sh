#!/bin/sh
# Times a training step of the `lm` in kolo (bench/lm_step.cc) and in its PyTorch twin
# (bench/peers/torch_lm.py) in one invocation, both on one thread in fp32 with AdamW on the
# same file-order batches, alternating the two (ROUNDS times) so that a busy machine slows
# both alike, and prints kolo's best median step time over PyTorch's. BASELINE=path/to/an/
# older/lm_step adds that build to the rounds (before/after figures from the same run).
# RANKS=N: both data-parallel on N processes of one thread (kolo: `kolo run -n N` of lm_step,
# multi-worker-mirrored; PyTorch: DDP over gloo), the same global batch split over them.
# `--arch llama --kv-heads K` times the llama lm against its twin (bench/peers/torch_llama.py).
# Usage: bench/lm_vs_torch.sh [BUILD_DIR] [--layers L --d-model C --heads H --seq-len T
#          --batch B --steps N --arch gpt|llama --kv-heads K ...]   (defaults: the lm's
#          default size, 4 blocks, C 128, 4 heads, T 64, batch 16, gpt; BUILD_DIR
#          build/release; ROUNDS=3; RANKS=1)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build/release"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
  build=$1
  shift
fi
rounds=${ROUNDS:-3}
ranks=${RANKS:-1}
launch=""
[ "$ranks" -gt 1 ] && launch="$build/src/cli/kolo run -n $ranks --"
baseline=${BASELINE:-}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# glibc's malloc on transparent huge pages, as `kolo run` starts its ranks (KOLO_HUGE_PAGES);
# the peer gets the same.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
field() { sed 's/.*"'"$1"'": \([0-9.]*\).*/\1/'; }
lower() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == 0 || b < a) ? b : a }'; }
best_k=0 best_t=0 best_b=0
i=0
while [ "$i" -lt "$rounds" ]; do
  k_out=$($launch "$build/bench/lm_step" "$@" | grep kolo_lm_step)
  t_out=$(/usr/bin/python3 "$here/peers/torch_lm.py" --ranks "$ranks" "$@" | grep torch_lm_step)
  echo "$k_out"
  echo "$t_out"
  best_k=$(lower "$best_k" "$(echo "$k_out" | field step_ms_median)")
  best_t=$(lower "$best_t" "$(echo "$t_out" | field step_ms_median)")
  if [ -n "$baseline" ]; then
    b_out=$($launch "$baseline" "$@" | grep kolo_lm_step)
    echo "baseline $b_out"
    best_b=$(lower "$best_b" "$(echo "$b_out" | field step_ms_median)")
  fi
  i=$((i + 1))
done
params=$(echo "$k_out" | field parameters)
size="${*:-default size}, $ranks rank(s)"
if [ -n "$baseline" ]; then
  awk -v b="$best_b" -v t="$best_t" -v s="$size" \
    'BEGIN { printf "lm %s: baseline kolo %.2f ms, PyTorch %.2f ms, baseline/PyTorch = %.2fx\n", s, b, t, b / t }'
fi
awk -v k="$best_k" -v t="$best_t" -v p="$params" -v s="$size" \
  'BEGIN { printf "lm %s (%.2f M parameters): kolo %.2f ms, PyTorch %.2f ms, kolo/PyTorch = %.2fx\n",
           s, p / 1e6, k, t, k / t }'
