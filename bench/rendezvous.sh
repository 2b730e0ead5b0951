#!/usr/bin/env bash
# The control plane at thousands of ranks, against PyTorch 1.13's TCPStore in one
# invocation. kolo: `kolo bench rendezvous` (simulated ranks as threads of a few processes,
# each running the native backend's rendezvous, a counter barrier, a step's store operations
# and, with DROP, the elastic regroup after DROP percent of the ranks vanish, over its own
# TCP connection to its simulated host's store, HOSTS host stores forwarding to one root
# store; FLAT=1: every rank connects to the root instead). torch: bench/peers/torch_store_rendezvous.py (threads,
# one TCPStore client each: connect, publish an address, read both ring neighbours'
# addresses, a counter barrier). Prints each one's JSON line and the ratio of
# rendezvous+barrier times. PEER_MAX: the largest rank count the peer is run at; a peer that
# fails is reported and the run goes on.
# Usage: RANKS="1024 4096 16384" HOSTS=64 DROP=1 PEER_MAX=4096 bash bench/rendezvous.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kolo=$PWD/build/release/src/cli/kolo
ranks=${RANKS:-"1024 4096 16384"}
drop=${DROP:-1}
hosts=${HOSTS:-64}
flat=()
[ "${FLAT:-0}" = 1 ] && flat=(--no-host-stores)
peer_max=${PEER_MAX:-4096}
ulimit -n "$(ulimit -Hn)"
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, open-file limit $(ulimit -n)"
for n in $ranks; do
  k=$($kolo bench rendezvous --ranks "$n" --hosts "$hosts" "${flat[@]}" --drop "$drop" --timeout 600 --json)
  echo "kolo  $k"
  if [ "$n" -le "$peer_max" ]; then
    if ! t=$(/usr/bin/python3 bench/peers/torch_store_rendezvous.py --ranks "$n" 2>&1 | tail -1) ||
       ! [[ "$t" == "{"* ]]; then
      echo "torch failed at $n ranks: $t"
      continue
    fi
    echo "torch $t"
    /usr/bin/python3 - "$k" "$t" <<'PY'
import json, sys
k, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ks, ts = k["rendezvous_s"] + k["barrier_s"], t["rendezvous_s"] + t["barrier_s"]
print("ratio ranks=%d rendezvous+barrier: kolo %.3f s, torch %.3f s, torch/kolo %.1fx"
      % (k["ranks"], ks, ts, ts / ks))
PY
  fi
done
