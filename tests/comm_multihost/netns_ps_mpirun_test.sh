#!/usr/bin/env bash
# A parameter-server job started by Open MPI's mpirun across two hosts on one machine (two
# network namespaces joined through a bridge, each with a host name of its own that both
# resolve): `mpirun -np 4` with KOLO_PS_SERVERS=1 and a hostfile of two slots per host, so
# ranks 0 (the server) and 1 (the chief) run on host 1 and ranks 2 and 3 (the workers) on
# host 2. mpirun starts host 2's ranks through a plm_rsh_agent that does what ssh would: run
# the command on that host (ip netns exec). The roles come from the ranks; rank 0 hosts the
# store and tells every rank its host name over MPI, so each push and pull of a worker
# crosses the bridge. The sync job must finish with both workers alive, every unit done and a
# trained model.
# Exit 77 (ctest SKIP) with a message where namespaces are forbidden, or mpirun or the data is
# missing.
# Usage: netns_ps_mpirun_test.sh KOLO_BINARY MPIRUN
set -u
kolo="$1"
mpirun="$2"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=netns_hosts.sh
. "$here/netns_hosts.sh"

if ! command -v unshare >/dev/null 2>&1; then
  echo "SKIPPED: mpirun parameter-server test across hosts: unshare (util-linux) is missing"
  exit 77
fi
netns_test_begin "mpirun parameter-server test across hosts" fashion-mnist
netns_name_hosts

# What ssh would do for mpirun: "AGENT HOST COMMAND..." runs COMMAND (one shell line, as
# ssh passes it) on HOST, here the namespace of that name, under that host name.
cat >"$dir/agent.sh" <<'EOF'
#!/bin/sh
host="$1"
shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
EOF
chmod +x "$dir/agent.sh"
printf '%s slots=2\n%s slots=2\n' "$NETNS_H1" "$NETNS_H2" >"$dir/hosts"

# Every rank says where it runs before it becomes kolo train.
rc=0
netns_on "$NETNS_H1" timeout 240 "$mpirun" --allow-run-as-root -np 4 --hostfile "$dir/hosts" \
  --mca plm_rsh_agent "$dir/agent.sh" --mca oob_tcp_if_include eth0 \
  --mca btl_tcp_if_include eth0 \
  -x KOLO_PS_SERVERS=1 -x KOLO_TIMEOUT=60 -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
  sh -c 'echo "rank $OMPI_COMM_WORLD_RANK runs on $(hostname)" >&2; exec "$@"' sh \
  "$kolo" train --strategy parameter-server --ps-mode sync --model mlp --optimizer sgd \
  --lr 0.1 --momentum 0.5 --batch 128 --epochs 1 --train-limit 12000 --ps-unit-batches 4 \
  --threads 1 --quiet --metrics "$dir/m.jsonl" >"$dir/out" 2>"$dir/err" || rc=$?

fail() {
  echo "FAIL: $1 (mpirun exit status $rc)"
  tail -n 1 "$dir/m.jsonl" 2>/dev/null
  cat "$dir/out" "$dir/err"
  exit 1
}
[ $rc -eq 0 ] || fail "mpirun failed"
for rank in 0 1; do
  grep -q "rank $rank runs on $NETNS_H1" "$dir/err" || fail "rank $rank did not run on host 1"
done
for rank in 2 3; do
  grep -q "rank $rank runs on $NETNS_H2" "$dir/err" || fail "rank $rank did not run on host 2"
done
grep -q 'test_accuracy .* ps_mode sync .* workers_alive 2' "$dir/out" ||
  fail "no summary line of the chief with 2 live workers"
python3 - "$dir/m.jsonl" <<'EOF' || fail "the metrics do not show a finished, trained job"
import json, sys
last = json.loads(open(sys.argv[1]).read().splitlines()[-1])
# --batch 128 over 2 workers: 93 sync steps of two pushes of 64, in units of 4 two alike at
# a time and then two of the last push each -> 48 units, both workers taking part.
ok = (last.get("final") and last["workers_alive"] == 2 and len(last["units_done"]) == 2
      and sum(last["units_done"]) == 48 and min(last["units_done"]) > 0
      and last["test_accuracy"] > 0.5)  # trained (chance is 0.1); sync reaches about 0.75
sys.exit(0 if ok else 1)
EOF
echo "ok: $(grep -o 'test_accuracy [0-9.]*' "$dir/out");" \
  "server and chief on $NETNS_H1, workers on $NETNS_H2"
echo "mpirun parameter-server test across hosts passed"
