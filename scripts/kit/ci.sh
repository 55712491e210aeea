#!/usr/bin/env bash
# CI's gpu-kit stage: the kit machinery checked without a second build. The kit is staged from the
# CI build's own binaries (build/: the same sources, built with MPI and for sm_80 + sm_90a, so
# OpenMPI's libraries are bundled too and the size cap is 64 MiB instead of 48), then ctest -L kit
# runs its self-containment check and its dry run on it. The kit for the GPU machine itself is
# `scripts/gpu-kit.sh` (build-kit/: sm_90a, no MPI), built by hand before a lease.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT_SKIP_BUILD=1 KIT_BUILD_DIR=build KIT_DIR=build/gpu-kit KIT_MAX_MIB=64 bash scripts/gpu-kit.sh
AUTOSP_KIT_DIR="$PWD/build/gpu-kit" KIT_MAX_MIB=64 ctest --test-dir build -L kit --output-on-failure
