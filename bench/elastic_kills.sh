#!/usr/bin/env bash
# Elastic recovery under SIGKILL at a random moment, many times: 3 ranks of
#   kolo run --elastic --min-ranks 2 -n 3 --timeout 60 -- kolo train --strategy
#   multi-worker-mirrored --model mlp --epochs 3 --batch 96   (EPOCHS=1: a shorter job)
# with launch rank 2 SIGKILLed from outside 1.5-4.5 s after the job's first step (so the kill
# lands anywhere in a step: compute, a ring step, a cross-memory-attach copy, the barrier).
# Per run: the job's wall time, the recovered event's recovery_s (from the first survivor's
# sight of the loss to the next completed step) and whether any survivor waited out a
# deadline (a Timeout "after 60" in its log). Prints the worst recovery and how many runs
# waited out a deadline, against an uninterrupted run's wall time measured first.
# Usage: [RUNS=50] [EPOCHS=3] [KOLO=path/to/kolo] bash bench/elastic_kills.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kolo=${KOLO:-$PWD/build/release/src/cli/kolo}  # KOLO=PATH: another build
runs=${RUNS:-50}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
job=(--elastic --min-ranks 2 -n 3 --timeout 60 -- "$kolo" train --strategy multi-worker-mirrored
  --model mlp --epochs "${EPOCHS:-3}" --batch 96 --quiet)

echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, $runs runs"
t0=$(date +%s.%N)
"$kolo" run "${job[@]}" >/dev/null 2>&1
plain=$(echo "$(date +%s.%N) - $t0" | bc)
printf "uninterrupted: %.2f s\n" "$plain"
printf "%4s %8s %8s %11s %s\n" run kill_s wall_s recovery_s waited_deadline

# Launch rank 2's pid among the launcher's children (KOLO_RANK in its environment).
rank2() {
  local p
  for p in $(pgrep -P "$1" || true); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'KOLO_RANK=2'; then
      echo "$p"
      return
    fi
  done
}

worst=0 stalls=0 failed=0 kills=0
for i in $(seq 1 "$runs"); do
  rm -f "$dir"/*
  t0=$(date +%s.%N)
  "$kolo" run "${job[@]}" --metrics "$dir/metrics.jsonl" >"$dir/out" 2>&1 &
  launcher=$!
  # The first step has run once the metrics file exists; the kill comes 1.5-4.5 s later.
  while [ ! -s "$dir/metrics.jsonl" ] && kill -0 "$launcher" 2>/dev/null; do sleep 0.05; done
  delay=$(awk -v r="$RANDOM" 'BEGIN { printf "%.2f", 1.5 + 3.0 * r / 32767 }')
  sleep "$delay"
  victim=$(rank2 "$launcher")
  killed=no
  if [ -n "$victim" ] && kill -KILL "$victim" 2>/dev/null; then killed=yes; fi
  rc=0
  wait "$launcher" || rc=$?
  wall=$(echo "$(date +%s.%N) - $t0" | bc)
  recovery=$(grep -o '"recovery_s":[0-9.e-]*' "$dir/metrics.jsonl" | head -1 | cut -d: -f2 || true)
  waited=no
  if grep -q 'after 60\.0 s\|not complete after 60' "$dir/out"; then
    waited=yes
    stalls=$((stalls + 1))
  fi
  [ "$rc" -ne 0 ] && failed=$((failed + 1))
  [ "$killed" = yes ] && kills=$((kills + 1))
  [ -z "$recovery" ] && recovery=none
  [ "$killed" = no ] && recovery="none (the job ended before the kill)"
  printf "%4d %8s %8.2f %11s %s%s\n" "$i" "$delay" "$wall" "$recovery" "$waited" \
    "$([ "$rc" -ne 0 ] && echo " (exit $rc)")"
  if [[ "$recovery" != none* ]] && [ "$(echo "$recovery > $worst" | bc)" = 1 ]; then worst=$recovery; fi
done
echo "$kills of $runs runs killed rank 2; worst recovery_s: $worst; runs that waited out a deadline: $stalls; failed jobs: $failed"
