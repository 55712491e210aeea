#!/usr/bin/env bash
# The test command: installs what is missing (Debian packages), configures, builds, runs ctest.
#   scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# transformers for ref.hf_roundtrip (created once; without it that test is skipped)
bash scripts/hf-venv.sh >/dev/null || echo "test: no transformers venv (.venv-hf); ref.hf_roundtrip will be skipped" >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
