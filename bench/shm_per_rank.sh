#!/usr/bin/env bash
# Shared memory per rank against the local rank count: runs `kolo bench allreduce --ranks N`
# (a size sweep through every Auto choice, then a forced algorithm) and samples the host's
# Shmem (/proc/meminfo) every 20 ms; prints the peak growth over the idle value, per rank.
# The figure is host-wide: other programs using shared memory at the same time add to it.
#   bench/shm_per_rank.sh [N ...]        default: 2 8 64 256; ALGOS="auto ring" by default
set -euo pipefail
cd "$(dirname "$0")/.."
kolo=${KOLO:-build/release/src/cli/kolo}
[ -x "$kolo" ] || { echo "build first: cmake --preset release && cmake --build --preset release" >&2; exit 1; }
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(2 8 64 256)
shmem_kib() { awk '/^Shmem:/ {print $2}' /proc/meminfo; }

printf '%6s %12s %14s %10s  %s\n' ranks "peak MiB" "KiB per rank" seconds result
for n in "${counts[@]}"; do
  for algo in ${ALGOS:-auto ring}; do
    idle=$(shmem_kib)
    peak=$idle
    start=$(date +%s%N)
    "$kolo" bench allreduce --ranks "$n" --algo "$algo" -b 4K -e 4M -f 4 -n 3 -w 1 --timeout 600 \
      >/tmp/kolo_shm_per_rank.$$ 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      now=$(shmem_kib)
      [ "$now" -gt "$peak" ] && peak=$now
      sleep 0.02
    done
    if wait "$pid"; then result="ok ($algo)"; else result="FAILED ($algo): $(tail -n 1 /tmp/kolo_shm_per_rank.$$)"; fi
    awk -v n="$n" -v kib=$((peak - idle)) -v ns=$(($(date +%s%N) - start)) -v result="$result" \
      'BEGIN { printf "%6d %12.1f %14.1f %10.1f  %s\n", n, kib / 1024, kib / n, ns / 1e9, result }'
  done
done
rm -f /tmp/kolo_shm_per_rank.$$
