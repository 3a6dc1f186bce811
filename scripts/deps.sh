#!/usr/bin/env bash
# Installs the Debian packages pipesched builds with, if any are missing.
# As root it runs apt-get; otherwise it prints the apt-get line and stops.
# Usage: scripts/deps.sh [extra-package ...]
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
      libopenblas-dev nlohmann-json3-dev libopenmpi-dev openmpi-bin "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  echo "pipesched: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "pipesched: missing Debian packages; run:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
