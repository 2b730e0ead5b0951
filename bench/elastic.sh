#!/usr/bin/env bash
# kolo's elastic recovery against torchrun's elastic restart, in one invocation. 4 ranks
# (mlp, global batch 12, 120 samples: 10 steps an epoch, 40 steps); launch rank R is
# SIGKILLed before step S (mid-epoch), for several (R, S).
#   kolo: kolo run --elastic at two detection deadlines (--timeout): the survivors regroup
#     in memory. Prints the time from the kill to the next completed step (since_kill_s),
#     from the new primary's failed collective to that step (recovery_s), and the steps
#     completed before the kill that were done again (0 unless a rank had finished the
#     failed step).
#   torch: PyTorch 1.13 DDP (gloo) under torchrun's restart with a checkpoint every epoch.
#     Debian's torchrun fails at start, so bench/peers/torch_elastic_restart.py does what
#     its agent does with --max_restarts 1 (poll the workers every monitor interval, stop
#     them all, start them all again with a new rendezvous, reload the last checkpoint), at
#     torchrun's default interval (5 s) and at 0.1 s. Prints the same two figures.
# Usage: bash bench/elastic.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kolo=$PWD/build/release/src/cli/kolo
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cases=${CASES:-"1:15 0:25 3:35"}
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
printf "%-22s %-5s %-5s %13s %11s %13s\n" who rank step since_kill_s recovery_s steps_redone
for case in $cases; do
  rank=${case%%:*} step=${case##*:}
  for timeout in 3 10; do
    rm -f "$dir"/*
    $kolo run --elastic --min-ranks 2 -n 4 --timeout $timeout -- $kolo train --model mlp \
      --strategy multi-worker-mirrored --batch 12 --optimizer sgd --lr 0.05 --quiet \
      --train-limit 120 --steps 40 --debug-kill-rank "$case" --debug-sample-log "$dir/samples" \
      --metrics "$dir/metrics.jsonl" >/dev/null 2>&1
    line=$(grep '"recovered"' "$dir/metrics.jsonl")
    since=$(sed -n 's/.*"since_kill_s":\([0-9.e-]*\).*/\1/p' <<<"$line")
    recovery=$(sed -n 's/.*"recovery_s":\([0-9.e-]*\).*/\1/p' <<<"$line")
    # Steps completed in generation 0 by some rank at or after the agreed step: done again.
    agreed=$(sed -n 's/.*"event":"membership".*"step":\([0-9]*\).*/\1/p;s/.*"step":\([0-9]*\).*"event":"membership".*/\1/p' "$dir/metrics.jsonl" | head -1)
    redone=$(cat "$dir"/samples.rank-* | awk -v a="$agreed" '$1 == 0 && $2 >= a { print $2 }' | sort -u | wc -l)
    printf "%-22s %-5s %-5s %13.3f %11.3f %13s\n" "kolo --timeout $timeout" "$rank" "$step" "$since" "$recovery" "$redone"
  done
  for interval in 5 0.1; do
    line=$(/usr/bin/python3 bench/peers/torch_elastic_restart.py --nprocs 4 --kill-rank "$rank" \
      --kill-step "$step" --monitor-interval "$interval" 2>/dev/null | tail -n 1)
    since=$(sed -n 's/.*"recovery_s": \([0-9.e-]*\).*/\1/p' <<<"$line")
    detect=$(sed -n 's/.*"detect_s": \([0-9.e-]*\).*/\1/p' <<<"$line")
    redone=$(sed -n 's/.*"steps_redone": \([0-9]*\).*/\1/p' <<<"$line")
    printf "%-22s %-5s %-5s %13.3f %11s %13s\n" "torch restart, poll $interval" "$rank" "$step" "$since" "(seen $detect)" "$redone"
  done
done
