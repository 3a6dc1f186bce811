#!/usr/bin/env bash
# Downloads the Debian packages that the GPU build needs besides the CUDA toolkit into
# .gpu-deps/ (git-ignored), for a GPU machine that cannot reach a package registry (the
# device machine of this workplace: an image with nvcc, CMake and ninja, but without
# Abseil, GoogleTest, Google Benchmark, OpenBLAS or nlohmann-json). scripts/gpu-check.sh
# unpacks them under /opt/pipesched-deps when the machine lacks the libraries. Run it
# where apt works (any Debian 12 machine; no root needed), then send .gpu-deps along with
# the tree (the device tool: carry [".gpu-deps"]). About 15 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libabsl-dev libabsl20220623 libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
      libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
      nlohmann-json3-dev)
mkdir -p .gpu-deps
cd .gpu-deps
rm -f ./*.deb
# apt-get download drops root to _apt, which cannot write to most folders: fetch in a
# temporary folder it may write to, then move the files here.
tmp=$(mktemp -d)
chmod 777 "$tmp"
(cd "$tmp" && apt-get download "${pkgs[@]}") >/dev/null
mv "$tmp"/*.deb .
rmdir "$tmp"
echo "pipesched: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1), in .gpu-deps/"
