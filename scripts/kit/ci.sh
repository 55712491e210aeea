#!/usr/bin/env bash
# CI's gpu-kit stage: the kit the GPU machine gets, built as scripts/gpu-kit.sh builds it
# (build-kit/: sm_90a, no MPI; about 4 minutes on 2 cores) into .gpu-kit/ under its 48 MiB cap,
# then ctest -L kit runs its self-containment check and its dry run on it (docs/gpu-kit.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/gpu-kit.sh
AUTOSP_KIT_DIR="$PWD/.gpu-kit" ctest --test-dir build -L kit --output-on-failure
