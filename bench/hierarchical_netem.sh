#!/usr/bin/env bash
# Hierarchical vs flat ring allreduce between two "hosts" (network namespaces joined by a
# bridge, tests/comm_multihost/netns_hosts.sh) whose links are shaped with tc netem
# (default: rate 1gbit, delay 1ms, on each host's egress), 2 hosts x 2 ranks, at 16 MiB.
# Prints both rows and the ratio of their times. Needs root and network namespaces.
# Usage: bench/hierarchical_netem.sh [KOLO_BINARY]
# Environment: KOLO, SIZES (default 16M), NETEM ("rate 1gbit delay 1ms"), ITERS (5), WARMUP (1).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
kolo="${1:-${KOLO:-$root/build/release/src/cli/kolo}}"
sizes="${SIZES:-16M}"
netem="${NETEM:-rate 1gbit delay 1ms}"
iters="${ITERS:-5}"
warmup="${WARMUP:-1}"
# shellcheck source=../tests/comm_multihost/netns_hosts.sh
. "$root/tests/comm_multihost/netns_hosts.sh"

[ -x "$kolo" ] || { echo "hierarchical_netem: kolo binary not found at $kolo" >&2; exit 2; }
if ! why="$(netns_supported)"; then echo "hierarchical_netem: cannot run: $why" >&2; exit 2; fi
command -v tc >/dev/null || { echo "hierarchical_netem: tc (iproute2) is missing" >&2; exit 2; }

store="$(mktemp -d /tmp/kolo-netem-store.XXXXXX)"
trap 'netns_destroy; rm -rf "$store"' EXIT
netns_create
# netem where the kernel has it; otherwise (no sch_netem) a token bucket gives the rate
# alone, without the delay, and the header says so.
shaping="netem $netem"
# shellcheck disable=SC2086
if ! ip netns exec "$NETNS_H1" tc qdisc add dev eth0 root netem $netem 2>/dev/null; then
  rate="$(grep -oE 'rate [^ ]+' <<<"$netem" | awk '{print $2}')"
  shaping="tbf rate ${rate:-1gbit} burst 1mb latency 400ms (kernel lacks netem: no added delay)"
  ip netns exec "$NETNS_H1" tc qdisc add dev eth0 root tbf rate "${rate:-1gbit}" burst 1mb latency 400ms
  ip netns exec "$NETNS_H2" tc qdisc add dev eth0 root tbf rate "${rate:-1gbit}" burst 1mb latency 400ms
else
  # shellcheck disable=SC2086
  ip netns exec "$NETNS_H2" tc qdisc add dev eth0 root netem $netem
fi

# run ALGO: 4 ranks (0-1 on host a, 2-3 on host b); prints rank 0's JSON rows.
run() {
  local algo="$1" dir="$store/$1" pids=() r ns addr host
  mkdir -p "$dir"
  for r in 0 1 2 3; do
    if [ $r -lt 2 ]; then ns="$NETNS_H1"; addr="$NETNS_ADDR1"; host=host-a; else ns="$NETNS_H2"; addr="$NETNS_ADDR2"; host=host-b; fi
    ip netns exec "$ns" "$kolo" bench allreduce --algo "$algo" --sizes "$sizes" -n "$iters" -w "$warmup" --json \
      --timeout 120 --store-dir "$dir" --rank $r --world-size 4 --listen "$addr" --host-id "$host" \
      >"$dir/rank$r.out" 2>"$dir/rank$r.err" &
    pids+=($!)
  done
  local rc=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  if [ $rc -ne 0 ]; then head -5 "$dir"/rank*.err >&2; return 1; fi
  cat "$dir/rank0.out"
}

echo "# 2 hosts x 2 ranks, shaping: $shaping on each host's link; sizes $sizes, $iters iterations" >&2
hier="$(run hierarchical)"
ring="$(run ring)"
echo "$hier"
echo "$ring"
python=/usr/bin/python3
[ -x "$python" ] || python=python3
"$python" - "$hier" "$ring" <<'PY'
import json, sys
hier = [json.loads(l) for l in sys.argv[1].splitlines() if l.startswith("{")]
ring = [json.loads(l) for l in sys.argv[2].splitlines() if l.startswith("{")]
print()
print("| size | hierarchical t (ms) | busbw | ring t (ms) | busbw | ring t / hierarchical t | correct |")
print("|---|---|---|---|---|---|---|")
for h, r in zip(hier, ring):
    print(f"| {h['bytes']} | {h['t_median_us']/1e3:.1f} | {h['busbw_GBps']:.4f} | {r['t_median_us']/1e3:.1f} "
          f"| {r['busbw_GBps']:.4f} | {r['t_median_us']/h['t_median_us']:.2f}x | "
          f"{'yes' if h['correct'] and r['correct'] else 'NO'} |")
PY
