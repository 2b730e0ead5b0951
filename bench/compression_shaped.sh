#!/usr/bin/env bash
# The SHAPED=1 half of bench/compression.sh (run it through that script): `kolo train --model
# mlp` on 2 hosts x 2 ranks, the hosts being network namespaces joined by a bridge
# (tests/comm_multihost/netns_hosts.sh) whose egress is shaped with tbf at each rate of RATES.
# Per rate, REPEAT rounds of STEPS steps per method (methods alternating within a round), the
# best steady-state global samples/s, and the bytes on the wire per step: host 1's eth0
# counters (sent + received) over a run of STEPS steps minus a run of 11 steps (set-up,
# broadcast, evaluation and PowerSGD's 10 plain warm-up steps cancel), over STEPS - 11.
# Prints one table per rate with the accuracy lines it was given (loopback runs, same ranks).
# Each host runs on its own half of this machine's CPUs (taskset), as two machines would: the
# hosts then do not take each other's cores, and each host's ranks see how many cores they
# have (more ranks than cores: short spins). PIN=0 lets both hosts use every CPU.
# Usage: compression_shaped.sh KOLO ACCURACY_LINES   (lines "method accuracy payload-bytes")
#   METHODS  STEPS  REPEAT  RATES="1gbit"  PIN=1
set -euo pipefail
kolo="$1"
accuracy="$2"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
methods=${METHODS:-"none fp16 bf16 powersgd:4 topk:0.01"}
steps=${STEPS:-200}
repeat=${REPEAT:-2}
pin=${PIN:-1}
rates=${RATES:-1gbit}
# shellcheck source=../tests/comm_multihost/netns_hosts.sh
. "$root/tests/comm_multihost/netns_hosts.sh"
if ! why="$(netns_supported)"; then echo "compression: SHAPED=1 cannot run: $why" >&2; exit 2; fi
command -v tc >/dev/null || { echo "compression: SHAPED=1 needs tc (iproute2)" >&2; exit 2; }

work="$(mktemp -d /tmp/kolo-compression-shaped.XXXXXX)"
export KOLO_TOKEN="compression-shaped-$$"  # the nodes of one job share it
trap 'netns_destroy; rm -rf "$work"' EXIT
netns_create

# tbf at rate $1 on both hosts' egress; the bucket holds a few milliseconds of traffic.
shape() {
  local burst=1mb
  case "$1" in *[0-9]gbit) [ "${1%gbit}" -ge 10 ] && burst=8mb ;; esac
  for ns in "$NETNS_H1" "$NETNS_H2"; do
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$1" burst "$burst" latency 400ms
  done
}

link_bytes() {
  ip netns exec "$NETNS_H1" sh -c \
    'echo $(( $(cat /sys/class/net/eth0/statistics/tx_bytes) + $(cat /sys/class/net/eth0/statistics/rx_bytes) ))'
}

# The CPUs of host $1 (0 or 1): its half of the machine's, or all of them without PIN.
cpus_of() {
  local n half
  n=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc reads them
  half=$(( n / 2 ))
  if [ "$pin" != 1 ] || [ "$half" -lt 1 ]; then echo "0-$((n - 1))"
  elif [ "$1" = 0 ]; then echo "0-$((half - 1))"
  else echo "$half-$((n - 1))"; fi
}

port=29400
# One 4-rank job of method $1 for $2 steps; prints "steady_samples_per_s link_bytes".
job() {
  port=$((port + 1))
  local before after rc=0 p0 p1
  before=$(link_bytes)
  for node in 0 1; do
    local ns="$NETNS_H1"
    [ $node = 1 ] && ns="$NETNS_H2"
    ip netns exec "$ns" taskset -c "$(cpus_of $node)" timeout 600 "$kolo" run -n 2 --nnodes 2 --node-rank $node \
      --store "$NETNS_ADDR1:$port" --timeout 120 -- \
      "$kolo" train --strategy multi-worker-mirrored --threads 1 --prefetch off \
      --shard-optimizer off --model mlp --seed 1 --compress "$1" --steps "$2" --quiet \
      >"$work/node$node.out" 2>&1 &
    [ $node = 0 ] && p0=$! || p1=$!
  done
  wait "$p0" || rc=1
  wait "$p1" || rc=1
  after=$(link_bytes)
  if [ $rc -ne 0 ]; then cat "$work"/node*.out >&2; exit 1; fi
  local rate
  rate=$(grep -o 'steady_samples_per_s [0-9.]*' "$work/node0.out" | tail -n 1 | cut -d' ' -f2)
  echo "$rate $((after - before))"
}

for r in $rates; do
  shape "$r"
  lines=""
  for m in $methods; do
    out=$(job "$m" 11) || exit 1
    read -r _ base <<<"$out"
    out=$(job "$m" "$steps") || exit 1
    read -r _ total <<<"$out"
    wire=$(( (total - base) / (steps - 11) ))
    echo "shaped $r $m: $wire bytes on the wire per step" >&2
    lines="$lines
W $m $wire"
  done
  i=0
  while [ $i -lt "$repeat" ]; do
    for m in $methods; do
      out=$(job "$m" "$steps") || exit 1
      read -r s _ <<<"$out"
      echo "shaped $r $m: $s samples/s" >&2
      lines="$lines
S $m $s"
    done
    i=$((i + 1))
  done
  echo "# mlp, 2 hosts x 2 ranks (CPUs $(cpus_of 0) and $(cpus_of 1)), tbf $r on each host's egress; accuracy from the loopback runs (the same math)"
  printf "%-12s %9s %16s %14s %16s %14s %10s %9s\n" method accuracy "payload/step/rank" "payload vs none" \
    "wire bytes/step" "wire vs none" "samples/s" "vs none"
  echo "$accuracy$lines" | awk '
    NF == 3 && $1 != "W" && $1 != "S" { acc[$1] = $2; payload[$1] = $3 }
    $1 == "W" { wire[$2] = $3; order[++n] = $2 }
    $1 == "S" { if ($3 + 0 > best[$2] + 0) best[$2] = $3 }
    END {
      b = order[1]
      for (i = 1; i <= n; i++) {
        m = order[i]
        printf "%-12s %9s %16.0f %13.1fx %16.0f %13.1fx %10.0f %8.2fx\n", m, acc[m], payload[m],
          (payload[m] > 0 ? payload[b] / payload[m] : 0), wire[m], (wire[m] > 0 ? wire[b] / wire[m] : 0),
          best[m], (best[b] > 0 ? best[m] / best[b] : 0)
      }
    }'
done
