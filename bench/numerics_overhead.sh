#!/usr/bin/env bash
# Not a peer comparison: what the numeric checks cost. Steady samples/s of kolo train without
# and with --detect-anomaly (one device: mlp, cnn) and without and with --check-sync N (two
# ranks, mlp), each pair run back to back, REPEAT times (3). Usage: bash
# bench/numerics_overhead.sh [REPEAT]
set -euo pipefail
cd "$(dirname "$0")/.."
kolo=$PWD/build/release/src/cli/kolo
repeat=${1:-3}
rate() { "$@" --quiet 2>/dev/null | sed -n 's/.*steady_samples_per_s \([0-9.]*\).*/\1/p'; }
printf "%-44s %12s %12s %8s\n" case "off" "on" "on/off"
run_pair() {
  local label=$1 base=$2 flag=$3
  for i in $(seq "$repeat"); do
    off=$(rate $kolo $base)
    on=$(rate $kolo $base $flag)
    printf "%-44s %12.1f %12.1f %8.3f\n" "$label" "$off" "$on" "$(awk -v a="$on" -v b="$off" 'BEGIN { print a / b }')"
  done
}
run_pair "mlp one-device --detect-anomaly" "train --model mlp --steps 400" "--detect-anomaly"
run_pair "cnn one-device --detect-anomaly" "train --model cnn --steps 120" "--detect-anomaly"
run_pair "mlp 2 ranks --check-sync 10" "train --workers 2 --model mlp --steps 400" "--check-sync 10"
run_pair "mlp 2 ranks --check-sync 1" "train --workers 2 --model mlp --steps 400" "--check-sync 1"
