#!/usr/bin/env bash
# Installs everything kolo needs to build, test and train, from Debian's packages.
# Run as root on a fresh Debian 12 machine; safe to run again.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  ccache                     # compiled objects kept outside the clone: a second build reuses them
  libopenblas-dev            # GEMM (CBLAS) for matmul and convolution
  zlib1g-dev                 # gzip-compressed IDX files, deflated .npz members
  libpng-dev                 # image folders (kolo::data::ImageFolder): PNG decoding
  libjpeg-dev                # image folders: JPEG decoding (libjpeg62-turbo)
  libgtest-dev               # tests
  libcli11-dev               # command-line parsing
  nlohmann-json3-dev         # metrics, checkpoint metadata, safetensors headers
  libsodium-dev              # federated secure aggregation: X25519, ChaCha20, secretbox
  libopenmpi-dev openmpi-bin # MPI backend and the Open MPI peer benchmark
  dataset-fashion-mnist      # the main job's data
  iproute2                   # network-namespace multi-host tests
  slurm-wlm munge            # the Slurm test (tests/slurm/): slurmctld, slurmd, srun, sbatch, munged
  gnuplot-nox                # kolo report: the plots (SVG terminal)
  libdw-dev                  # flight-recorder dumps: names the frames of every thread's stack (elfutils)
  clang libclang-rt-14-dev   # libFuzzer harnesses (fuzz/): clang 14 and its fuzzer/sanitizer runtimes
  # kolo_torch (python/), the PyTorch backend, and its tests (label torch); also the PyTorch
  # peers of bench/ and the scripts that make golden fixtures. Without them CMake skips
  # kolo_torch with a message and those tests exit 77 (skipped).
  python3-torch libtorch-dev pybind11-dev python3-dev python3-numpy
  # bench/data_readers.sh's peers: pandas.read_csv, torchvision's ImageFolder (and PIL, which
  # also writes the image tests' files); torchvision's resnet18 for bench/ddp_oversubscribed.sh.
  python3-pandas python3-torchvision python3-pil
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
