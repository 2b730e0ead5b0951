#!/usr/bin/env bash
# Installs kolo from a build tree into a temporary prefix and uses it the two ways the README
# shows: examples/ configured on its own with find_package(kolo), and distributed_train.cc
# compiled with `pkg-config --cflags --libs kolo`. Then trains with both, the second under the
# installed `kolo run`, and runs each examples/strategies program by its own run line. Exits 77 (skipped) after building when Fashion-MNIST is absent.
#   usage: install_test.sh SOURCE_DIR BUILD_DIR CMAKE GENERATOR CXX [EXTRA_FLAGS]
set -euo pipefail
src=$1 build=$2 cmake=$3 generator=$4 cxx=$5 flags=${6:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log"
echo "installed into $prefix:"
(cd "$prefix" && find . -type f | sort | grep -v '^./include/kolo/.*/' | sed 's/^/  /')

# The installed headers stand alone: none names a private header under src/.
if grep -rnE '#include "(base|tensor|autograd|nn|optim|data|comm|parallel|checkpoint|observe|launch|train|report|cli)/' \
    "$prefix/include"; then
  echo "FAIL: an installed header includes a private header" >&2
  exit 1
fi

# kolo/kolo.h is the whole public API: it includes every installed header (nn's through
# kolo/nn/nn.h).
for header in $(cd "$prefix/include" && find kolo -name '*.h' ! -path kolo/kolo.h | sort); do
  if ! grep -qF "\"$header\"" "$prefix/include/kolo/kolo.h" "$prefix/include/kolo/nn/nn.h"; then
    echo "FAIL: kolo/kolo.h does not include $header" >&2
    exit 1
  fi
done

echo "== examples/ against the installed kolo (find_package)"
"$cmake" -S "$src/examples" -B "$tmp/examples" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_PREFIX_PATH="$prefix" \
  >"$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
"$cmake" --build "$tmp/examples" -j 2

echo "== distributed_train.cc through pkg-config"
pc=$(dirname "$(find "$prefix" -name kolo.pc)")
export PKG_CONFIG_PATH=$pc
echo "pkg-config --cflags --libs kolo: $(pkg-config --cflags --libs kolo)"
# shellcheck disable=SC2046,SC2086
"$cxx" -std=c++20 -O2 $flags "$src/examples/distributed_train.cc" -o "$tmp/distributed_train_pc" \
  $(pkg-config --cflags --libs kolo)

# Each strategy example runs by the line its first comment gives (kolo on the PATH, the
# program as ./NAME); without Fashion-MNIST they train on synthetic data, so they run here.
for example in "$src"/examples/strategies/*.cc; do
  line=$(head -1 "$example")
  echo "== examples/strategies: ${line#// run: }"
  (cd "$tmp/examples/strategies" && PATH="$prefix/bin:$PATH" bash -c "${line#// run: }" </dev/null) |
    tail -1
done

data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
  echo "SKIPPED: built against the installed kolo, but the run needs Fashion-MNIST in $data" \
       "(apt-get install dataset-fashion-mnist)"
  exit 77
fi
cd "$tmp"
echo "== train_custom_model 60"
"$tmp/examples/train_custom_model" 60 </dev/null
echo "== kolo run -n 2 -- distributed_train_pc 40"
"$prefix/bin/kolo" run -n 2 -- "$tmp/distributed_train_pc" 40 </dev/null
echo "PASS"
