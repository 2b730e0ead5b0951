#!/bin/sh
# Each kolo::data reader's records per second against its usual Python peer, in one
# invocation on the same files (bench/data_readers.cc, bench/peers/data_readers.py): CSV vs
# pandas.read_csv, .npy vs numpy.load(mmap_mode='r'), an image folder with augmentations vs
# torchvision's ImageFolder under a DataLoader with 2 workers, u16 token windows vs nanoGPT's
# np.memmap get_batch. The files are made first (NumPy, PIL) in a temporary directory.
# Usage: bench/data_readers.sh [BUILD_DIR] [--rows N] [--images N] [--repeats N]
#          (defaults: build/release; 200000 CSV rows of 20 features, 50000 .npy samples of 784
#          bytes, 10000 PNG images of 32x32 RGB in 10 classes, 50M tokens; best of 3)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build/release"
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
  build=$1
  shift
fi
rows=200000 images=10000 repeats=3
while [ $# -gt 0 ]; do
  case $1 in
    --rows) rows=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work" "$rows" "$images" <<'PY'
import os, sys
import numpy as np
from PIL import Image
work, rows, images = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
x = rng.standard_normal((rows, 20)).astype(np.float32)
y = rng.integers(0, 5, rows)
with open(os.path.join(work, 'table.csv'), 'w') as f:
    f.write(','.join('f%d' % i for i in range(20)) + ',label\n')
    for row, label in zip(x, y):
        f.write(','.join('%.6g' % v for v in row) + ',%d\n' % label)
np.save(os.path.join(work, 'x.npy'), rng.integers(0, 256, (50000, 784), dtype=np.uint8))
np.save(os.path.join(work, 'y.npy'), rng.integers(0, 10, 50000))
for i in range(images):
    d = os.path.join(work, 'images', 'class%d' % (i % 10))
    os.makedirs(d, exist_ok=True)
    # Smooth images (as photographs are) compress as real PNGs do.
    base = rng.integers(0, 256, (4, 4, 3)).astype(np.float32)
    a = np.kron(base, np.ones((8, 8, 1))) + rng.normal(0, 8, (32, 32, 3))
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(os.path.join(d, '%05d.png' % i))
rng.integers(0, 50257, 50_000_000, dtype=np.uint16).tofile(os.path.join(work, 'tokens.bin'))
PY
args="--repeats $repeats --csv $work/table.csv --npy $work/x.npy $work/y.npy --images $work/images --tokens $work/tokens.bin"
kolo_out=$("$build/bench/data_readers" $args)
peer_out=$(/usr/bin/python3 "$here/peers/data_readers.py" $args)
echo "$kolo_out"
echo "$peer_out"
field() { sed 's/.*"'"$1"'": "\{0,1\}\([0-9.a-z_]*\).*/\1/'; }
printf '%-7s %-44s %14s %14s %8s\n' reader peer "kolo rec/s" "peer rec/s" ratio
for reader in csv npy images tokens; do
  k=$(echo "$kolo_out" | grep "\"$reader\"" | field per_s)
  p=$(echo "$peer_out" | grep "\"$reader\"" | field per_s)
  case $reader in
    csv) peer="pandas.read_csv" ;;
    npy) peer="numpy.load(mmap_mode='r'), batches of 256" ;;
    images) peer="torchvision ImageFolder + DataLoader(2 workers)" ;;
    tokens) peer="nanoGPT get_batch (np.memmap, 12x1024)" ;;
  esac
  awk -v r="$reader" -v peer="$peer" -v k="$k" -v p="$p" 'BEGIN { printf "%-7s %-44s %14.0f %14.0f %7.2fx\n", r, peer, k, p, k / p }'
done
