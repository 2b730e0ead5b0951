#!/usr/bin/env bash
# DDP of resnet18 over kolo against gloo with more ranks than CPUs (4 ranks on this machine's
# CPUs by default), in one invocation; bench/ddp_oversubscribed.py says what is run.
# Usage: bench/ddp_oversubscribed.sh [--kolo LABEL=DIR ...] [--rounds R] [--steps S] [--ranks N]
# (default: the kolo_torch of build/release; give a second --kolo to compare two builds).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
args=("$@")
[[ " $* " == *" --kolo "* ]] || args+=(--kolo "this=$root/build/release/python")
exec /usr/bin/python3 "$root/bench/ddp_oversubscribed.py" "${args[@]}"
