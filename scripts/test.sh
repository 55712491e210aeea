#!/usr/bin/env bash
# The test command: installs what is missing (Debian packages), configures, builds, runs ctest.
#   scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash scripts/hf-venv.sh >/dev/null ||  # transformers + tokenizers for the HF tests (made once)
  echo "warning: no .venv-hf (scripts/hf-venv.sh failed): the tests that need transformers skip" >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
