#!/usr/bin/env bash
# Builds pipesched and runs every CPU test. Usage: scripts/test.sh [preset]
#   preset: default (CUDA sources compiled when nvcc exists), host, asan, tsan.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-default}
bash scripts/deps.sh
jobs=$(nproc)
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
ctest --preset "$preset" -j "$jobs"
