#!/usr/bin/env bash
# Multi-host test on one machine: two network namespaces joined through a bridge act as
# two hosts with two ranks each (4 `kolo bench` processes meeting through a file store in
# a shared directory). The hierarchical algorithm (shared memory inside a host, TCP
# between the hosts; above 1 MiB the two-host pipeline) and the flat ring must give
# correct results across them.
# Exit 77 (ctest SKIP) with a message where namespaces are forbidden.
# Usage: netns_hierarchical_test.sh KOLO_BINARY
set -u
kolo="$1"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=netns_hosts.sh
. "$here/netns_hosts.sh"

if ! why="$(netns_supported)"; then
  echo "SKIPPED: multi-host namespace test: $why"
  exit 77
fi

store=""
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  netns_destroy
  [ -n "$store" ] && rm -rf "$store"
}
trap cleanup EXIT
netns_create
store="$(mktemp -d /tmp/kolo-netns-store.XXXXXX)"

# Sanity: the hosts reach each other over the bridge (a refused TCP connection proves it).
probe="$(ip netns exec "$NETNS_H1" timeout 5 bash -c "echo >/dev/tcp/$NETNS_ADDR2/9" 2>&1)"
if [ $? -ne 0 ] && ! grep -q refused <<<"$probe"; then
  echo "FAIL: $NETNS_H1 cannot reach $NETNS_ADDR2 over the bridge"
  exit 1
fi

failures=0
# run_job NAME ARGS...: 4 ranks, 0-1 on host 1, 2-3 on host 2; rank 0's JSON rows must all be correct.
run_job() {
  local name="$1"
  shift
  local dir="$store/$name"
  mkdir -p "$dir"
  pids=()
  local r ns addr host
  for r in 0 1 2 3; do
    if [ $r -lt 2 ]; then ns="$NETNS_H1"; addr="$NETNS_ADDR1"; host=host-a; else ns="$NETNS_H2"; addr="$NETNS_ADDR2"; host=host-b; fi
    ip netns exec "$ns" timeout 120 "$kolo" bench "$@" --store-dir "$dir" --rank $r --world-size 4 \
      --listen "$addr" --host-id "$host" --json --timeout 30 >"$dir/rank$r.out" 2>"$dir/rank$r.err" &
    pids+=($!)
  done
  local rc=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  pids=()
  local rows good
  rows=$(grep -c '^{' "$dir/rank0.out")
  good=$(grep -c '"correct":true' "$dir/rank0.out")
  if [ $rc -ne 0 ] || [ "$rows" -eq 0 ] || [ "$rows" -ne "$good" ] || ! grep -q '"np":4' "$dir/rank0.out"; then
    echo "FAIL $name: exit status $rc, $good of $rows rows correct"
    cat "$dir"/rank*.out "$dir"/rank*.err
    failures=$((failures + 1))
  else
    echo "ok   $name: $rows sizes correct across 2 hosts x 2 ranks"
  fi
}

run_job allreduce-hierarchical allreduce --algo hierarchical --sizes 4,1000,65536,1000003,5000011 -n 3 -w 1
run_job allreduce-hierarchical-avg allreduce --algo hierarchical --sizes 4K,1M -n 2 -w 1 -d f64 -o avg --out-of-place
run_job allreduce-ring allreduce --algo ring --sizes 1000,1M -n 2 -w 1
run_job broadcast broadcast --sizes 1000,1M -n 2 -w 1 -r 3
run_job allgather allgather --sizes 1000,1M -n 2 -w 1

[ $failures -eq 0 ] && echo "multi-host namespace test passed"
exit $((failures > 0))
