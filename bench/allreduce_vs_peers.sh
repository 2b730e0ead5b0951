#!/usr/bin/env bash
# kolo's allreduce against its peers, in one invocation: `kolo bench allreduce`, Open MPI's
# MPI_Allreduce (bench/peers/mpi_allreduce.c) and, when /usr/bin/python3 has torch,
# torch.distributed's gloo (bench/peers/torch_allreduce.py), at 4 KiB, 1 MiB, 16 MiB and
# 64 MiB with 2 and 4 ranks, all with the same timing method and per-size schedule (see
# bench/peers/mpi_allreduce.c); then a table
# of kolo's busbw over each peer's beside the memcpy bound (bench/peers/memcpy_bw.c).
#
# Usage: bench/allreduce_vs_peers.sh [KOLO_BINARY]
# Environment: KOLO (binary; default build/release/src/cli/kolo), NPS ("2 4"),
#   SIZES (bytes, "4096 1048576 16777216 67108864"), ROUNDS (1; runs interleaved per round),
#   OUT (folder for the raw JSON lines; default build/bench-peers), KOLO_BENCH_ARGS (extra),
#   PICK (best: per implementation, rank count and size the round with the highest busbw,
#   the default, which discounts rounds disturbed by other load alike for every peer;
#   median: the middle round), IDLE (percent: before every measurement wait until the CPUs
#   were at least this idle over 2 s, at most IDLE_WAIT seconds (300); other load on a
#   2-core machine moves these figures several-fold).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
kolo="${1:-${KOLO:-$root/build/release/src/cli/kolo}}"
nps="${NPS:-2 4}"
sizes="${SIZES:-4096 1048576 16777216 67108864}"
rounds="${ROUNDS:-1}"
out="${OUT:-$root/build/bench-peers}"
mkdir -p "$out"
results="$out/allreduce_vs_peers-$(date +%Y%m%d-%H%M%S).jsonl"

[ -x "$kolo" ] || { echo "allreduce_vs_peers: kolo binary not found at $kolo (build it or pass its path)" >&2; exit 2; }
command -v mpicc >/dev/null || { echo "allreduce_vs_peers: mpicc not found (install libopenmpi-dev)" >&2; exit 2; }
mpicc -O3 -march=native -Wall -o "$out/mpi_allreduce" "$here/peers/mpi_allreduce.c"
cc -O3 -march=native -Wall -o "$out/memcpy_bw" "$here/peers/memcpy_bw.c"
mpirun=(mpirun --allow-run-as-root --oversubscribe)
have_torch=0
if /usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1; then have_torch=1; fi
kolo_sizes="$(tr ' ' ',' <<<"$sizes")"

echo "# raw results: $results" >&2
"$out/memcpy_bw" 64 30 | tee -a "$results" >&2
# Waits until the CPUs were at least $IDLE percent idle over 2 s (no-op without IDLE).
settle() {
  [ -n "${IDLE:-}" ] || return 0
  local start idle u n s i w x y z t1 i1
  start=$(date +%s)
  while :; do
    read -r _ u n s i w x y z _ </proc/stat; t1=$((u + n + s + i + w + x + y + z)); i1=$i
    sleep 2
    read -r _ u n s i w x y z _ </proc/stat
    idle=$((100 * (i - i1) / (u + n + s + i + w + x + y + z - t1)))
    [ "$idle" -ge "$IDLE" ] && return 0
    if [ $(($(date +%s) - start)) -ge "${IDLE_WAIT:-300}" ]; then
      echo "# still only $idle% idle after ${IDLE_WAIT:-300} s; measuring anyway" >&2
      return 0
    fi
  done
}
for round in $(seq 1 "$rounds"); do
  for np in $nps; do
    settle
    echo "# round $round, $np ranks: kolo (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    # shellcheck disable=SC2086
    "$kolo" bench allreduce --ranks "$np" --sizes "$kolo_sizes" --anchor-schedule --json ${KOLO_BENCH_ARGS:-} \
      | tee -a "$results" >&2
    settle
    echo "# round $round, $np ranks: Open MPI (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    # shellcheck disable=SC2086
    "${mpirun[@]}" -np "$np" "$out/mpi_allreduce" $sizes | tee -a "$results" >&2
    if [ "$have_torch" = 1 ]; then
      settle
      echo "# round $round, $np ranks: gloo (load $(cut -d' ' -f1 /proc/loadavg))" >&2
      # shellcheck disable=SC2086
      /usr/bin/python3 "$here/peers/torch_allreduce.py" --np "$np" --sizes $sizes | tee -a "$results" >&2
    fi
  done
done
[ "$have_torch" = 1 ] || echo "# gloo skipped: /usr/bin/python3 has no torch" >&2
python=/usr/bin/python3
[ -x "$python" ] || python=python3
summary_input="$results"
if [ "${PICK:-best}" = best ]; then
  summary_input="${results%.jsonl}-best.jsonl"
  "$python" - "$results" "$summary_input" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    rec = json.loads(line)
    key = (rec.get("bench"), rec.get("np"), rec.get("bytes"))
    score = rec.get("busbw_GBps", rec.get("payload_GBps", 0))
    if key not in best or score > best[key][0]:
        best[key] = (score, line)
with open(sys.argv[2], "w") as out:
    for _, line in best.values():
        out.write(line if line.endswith("\n") else line + "\n")
PY
  echo "# best of $rounds round(s) per implementation, rank count and size: $summary_input" >&2
fi
"$python" "$here/peers/summarize_vs_peers.py" "$summary_input"
