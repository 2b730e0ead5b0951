#!/usr/bin/env bash
# Not a peer comparison (torchrun's restart is not measured here): kolo's elastic recovery.
# 4 ranks (mlp, global batch 12, 120 samples, 40 steps); launch rank R is SIGKILLed before
# step S, for several (R, S) and two detection deadlines (--timeout). Prints the time from
# the kill to the next completed step (since_kill_s), from the new primary's failed
# collective to that step (recovery_s), and the steps completed before the kill that were
# done again (0 unless a rank had finished the failed step). Usage: bash bench/elastic.sh
set -euo pipefail
cd "$(dirname "$0")/.."
kolo=$PWD/build/release/src/cli/kolo
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf "%-9s %-6s %-6s %14s %12s %12s\n" timeout rank step since_kill_s recovery_s steps_redone
for timeout in 3 10; do
  for case in "1:10" "0:20" "3:30"; do
    rank=${case%%:*} step=${case##*:}
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
    printf "%-9s %-6s %-6s %14.3f %12.3f %12s\n" "$timeout" "$rank" "$step" "$since" "$recovery" "$redone"
  done
done
