#!/bin/sh
# The products' rate on one thread, fp32: this core's FMA peak, and kolo's and torch's products
# of the lm's linear layers (forward, input gradient, weight gradient; bench/gemm_peak.cc,
# bench/peers/torch_gemm.py), in one invocation. Prints per product kolo's and PyTorch's
# GFLOP/s, kolo over PyTorch, and each as a fraction of the peak.
# Usage: bench/gemm_vs_torch.sh [BUILD_DIR] [--rows R --width C --repeats N]
#          (defaults: build/release; rows 1024 and width 128, the default lm's B*T and C)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build/release"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
  build=$1
  shift
fi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
kolo_out=$("$build/bench/gemm_peak" "$@")
torch_out=$(/usr/bin/python3 "$here/peers/torch_gemm.py" "$@")
echo "$kolo_out"
echo "$torch_out"
field() { sed 's/.*"'"$1"'": "\{0,1\}\([0-9.a-z_]*\).*/\1/'; }
peak=$(echo "$kolo_out" | grep fma_peak | field gflops)
echo "$kolo_out" | grep kolo_gemm | while read -r line; do
  kind=$(echo "$line" | field kind)
  m=$(echo "$line" | field m) k=$(echo "$line" | field k) n=$(echo "$line" | field n)
  kg=$(echo "$line" | field gflops)
  tg=$(echo "$torch_out" | grep "\"kind\": \"$kind\", \"m\": $m, \"k\": $k, \"n\": $n," | field gflops)
  awk -v kind="$kind" -v m="$m" -v k="$k" -v n="$n" -v kg="$kg" -v tg="$tg" -v p="$peak" 'BEGIN {
    printf "%-11s %5d x %4d -> %4d: kolo %6.1f GFLOP/s (%.2f of peak), PyTorch %6.1f (%.2f), kolo/PyTorch = %.2fx\n",
      kind, m, k, n, kg, kg / p, tg, tg / p, kg / tg }'
done
echo "fp32 FMA peak of one thread: $peak GFLOP/s"
