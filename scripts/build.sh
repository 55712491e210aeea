#!/usr/bin/env bash
# Configures and builds autosp into build/ (Release, Ninja). CUDA sources compile when nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then export PATH=/usr/local/cuda/bin:$PATH; fi
# AUTOSP_CUDA_ARCHITECTURES narrows the CUDA targets (default: 80 and 90a); CI compiles for 90a only.
archs=()
[ -n "${AUTOSP_CUDA_ARCHITECTURES:-}" ] && archs=(-DCMAKE_CUDA_ARCHITECTURES="$AUTOSP_CUDA_ARCHITECTURES")
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${AUTOSP_BUILD_TYPE:-Release}" "${archs[@]}" "$@" >/dev/null
cmake --build build -j"$(nproc)"
