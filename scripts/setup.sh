#!/usr/bin/env bash
# Installs the Debian packages autosp needs, only those that are missing (quick when all are there).
# Sourced by test.sh and train.sh; safe to run on its own.
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config catch2 libcxxopts-dev libspdlog-dev nlohmann-json3-dev
          libopenblas-dev libopenblas-openmp-dev libopenmpi-dev openmpi-bin python3-torch python3-numpy python3-matplotlib
          clang libclang-rt-14-dev libomp-dev)  # clang, its libFuzzer/sanitizer runtimes and OpenMP: scripts/fuzz.sh
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
