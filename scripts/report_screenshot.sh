#!/usr/bin/env bash
# Makes docs/report.png: two real two-rank runs of the cnn (one with rank 1 slowed 2x by
# --debug-slow-worker), `kolo report` over both, and the page opened in headless Chromium,
# which must load it with no console message. Needs a release build, gnuplot-nox and
# chromium (apt-get install chromium). Usage: bash scripts/report_screenshot.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
kolo=$PWD/build/release/src/cli/kolo
steps=${1:-300}
command -v chromium >/dev/null || { echo "chromium is not installed (apt-get install chromium)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for run in balanced slow-rank1; do
  extra=""
  [ "$run" = slow-rank1 ] && extra="--debug-slow-worker 1:2"
  mkdir -p "$work/$run"
  "$kolo" run -n 2 -- "$kolo" train --strategy multi-worker-mirrored --model cnn --steps "$steps" \
    --optimizer sgd --lr 0.02 --metrics-every 25 --quiet --metrics "$work/$run/metrics.jsonl" \
    --checkpoint-dir "$work/$run/ckpt" --checkpoint-every 100 $extra
done
"$kolo" report "$work/balanced" "$work/slow-rank1" -o "$work/report"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --enable-logging=stderr --v=0 \
  --window-size=1400,2200 --screenshot="$work/report.png" "file://$work/report/index.html" \
  2> "$work/chromium.log" || true
if grep -q ":CONSOLE" "$work/chromium.log"; then
  echo "console messages while loading the report:"; grep ":CONSOLE" "$work/chromium.log"; exit 1
fi
cp "$work/report.png" docs/report.png
echo "wrote docs/report.png (no console messages)"
