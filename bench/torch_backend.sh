#!/usr/bin/env bash
# torch.distributed over kolo vs gloo, measured in one run: all_reduce 4 KiB..64 MiB at 2 and
# 4 ranks (the anchors' timer), and DDP samples/s of the Fashion-MNIST MLP and CNN on 2 ranks.
# Usage: bench/torch_backend.sh [--quick] (after building kolo_torch in build/release).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root/build/release/python${PYTHONPATH:+:$PYTHONPATH}"
echo "# $(date -u +%F) $(getconf _NPROCESSORS_ONLN) CPUs, torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
exec /usr/bin/python3 "$root/bench/torch_backend.py" "$@"
