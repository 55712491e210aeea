#!/usr/bin/env bash
# Trains the default config (or the one given). Until the trainer lands (issue 3), this runs the
# forward pass of the config on random tokens and prints the loss and forward throughput.
#   scripts/train.sh [config.json]
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/default.json}
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
exec build/bin/autosp-bench --config "$config" --mode forward --iters 3
