#!/usr/bin/env bash
# A parameter-server job over two hosts on one machine (two network namespaces joined
# through a bridge): `kolo run --nnodes 2 --ps P --workers W` on each, node 0 hosting the
# store. The ranks are dealt out in order, so the servers and the chief run on host 1 and
# the workers on host 2 (with P = 1, W = 3 worker 0 stays on host 1): every push and pull of
# a host-2 worker crosses the bridge. Sync and async jobs must finish with every worker
# alive, every unit done and a trained model; only a worker on the servers' host exchanges
# values through shared memory (the metric ps_shared_memory), the others over TCP.
# Exit 77 (ctest SKIP) with a message where namespaces are forbidden or the data is missing.
# Usage: netns_ps_test.sh KOLO_BINARY
set -u
kolo="$1"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=netns_hosts.sh
. "$here/netns_hosts.sh"

netns_test_begin "multi-host parameter-server test" fashion-mnist
store="$NETNS_ADDR1:29500"

failures=0
# run_job NAME P W MODE SHARED: one epoch of 12,000 images in units of 4 pushes of 64 (async:
# 47 units; sync: each step's W pushes in W units alike, the epoch's last W shorter); node 0 on
# host 1, node 1 on host 2; SHARED: the worker connections expected through shared memory.
run_job() {
  local name="$1" servers="$2" workers="$3" mode="$4" shared="$5"
  local node ns rc=0 pid batch=64
  # --batch is the global batch: in sync W pushes of 64 make one step.
  [ "$mode" = sync ] && batch=$((64 * workers))
  pids=()
  for node in 0 1; do
    if [ $node = 0 ]; then ns="$NETNS_H1"; else ns="$NETNS_H2"; fi
    ip netns exec "$ns" env KOLO_TOKEN=netns-ps timeout 180 "$kolo" run --nnodes 2 \
      --node-rank $node --store "$store" --ps "$servers" --workers "$workers" --timeout 60 \
      -- "$kolo" train --strategy parameter-server --ps-mode "$mode" --model mlp \
      --optimizer sgd --lr 0.1 --momentum 0.5 --batch "$batch" --epochs 1 --train-limit 12000 \
      --ps-unit-batches 4 --quiet --metrics "$dir/$name.jsonl" \
      >"$dir/$name.node$node.out" 2>"$dir/$name.node$node.err" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  pids=()
  # No worker failed (a lost worker would not stop the job; the workers of host 2 reach the
  # servers only through the bridge), every unit was done and the model trained.
  if [ $rc -ne 0 ] || grep -q 'without it' "$dir/$name".node*.err ||
    ! python3 - "$dir/$name.jsonl" "$workers" "$shared" "$mode" <<'EOF'
import json, sys
last = json.loads(open(sys.argv[1]).read().splitlines()[-1])
workers = int(sys.argv[2])
steps = 12000 // (64 * workers)
units = 47 if sys.argv[4] != "sync" else steps // 4 * workers + (workers if steps % 4 else 0)
ok = (last.get("final") and last["workers_alive"] == workers
      and last["ps_shared_memory"] == int(sys.argv[3])
      and len(last["units_done"]) == workers and sum(last["units_done"]) == units
      and last["test_accuracy"] > 0.3)  # trained (chance is 0.1); one short async epoch with
                                          # stale gradients ends anywhere from 0.45 to 0.75
sys.exit(0 if ok else 1)
EOF
  then
    echo "FAIL $name: exit status $rc"
    tail -n 1 "$dir/$name.jsonl" 2>/dev/null
    cat "$dir/$name".node*.out "$dir/$name".node*.err
    failures=$((failures + 1))
  else
    echo "ok   $name: $(grep -o 'test_accuracy [0-9.]*' "$dir/$name.node0.out") across 2 hosts"
  fi
}

run_job sync-p2-w2 2 2 sync 0   # both workers on host 2
run_job async-p1-w3 1 3 async 1  # worker 0 beside the server

[ $failures -eq 0 ] && echo "multi-host parameter-server test passed"
exit $((failures > 0))
