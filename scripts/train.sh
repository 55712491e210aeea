#!/usr/bin/env bash
# Trains the default config (or the one given) on 2 CPU ranks with sequence parallelism 2:
# the embedded synthetic associative-recall task, so the loss and accuracy show attention
# learning across the whole (sharded) sequence. Extra arguments go to autosp-train.
#   scripts/train.sh [config.json] [autosp-train flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/default.json}
shift $(($# > 0 ? 1 : 0))
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
ranks=${AUTOSP_RANKS:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Through the launcher, so that SIGTERM or Ctrl-C saves a checkpoint and exits 4 (docs/reliability.md).
exec bash scripts/preemptible-mpirun.sh --oversubscribe -np "$ranks" build/bin/autosp-train --config "$config" "$@"
