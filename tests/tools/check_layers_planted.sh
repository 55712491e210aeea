#!/usr/bin/env bash
# .ci/check_layers.py fails on a planted include: a copy of src/ and apps/ passes unmodified, then
# fails (exit 1, the violation naming the file) once a graph/ file includes train/, again once a
# kernels/cuda header includes a kernels/cpu one, and once an engine/ file includes config/; and
# comm/ may not test AUTOSP_WITH_CUDA.
# Usage: check_layers_planted.sh SOURCE_DIR
set -euo pipefail
src_dir=${1:?usage: check_layers_planted.sh SOURCE_DIR}
checker="$src_dir/.ci/check_layers.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fresh_copy() {
  rm -rf "$tmp/repo"
  mkdir -p "$tmp/repo"
  cp -r "$src_dir/src" "$src_dir/apps" "$tmp/repo/"
}

# expect_violation NAME FILE PATTERN: the checker exits 1 and prints FILE:<line>: ... PATTERN.
expect_violation() {
  local name=$1 file=$2 pattern=$3 rc=0
  python3 "$checker" "$tmp/repo" >"$tmp/out" 2>&1 || rc=$?
  if [ "$rc" -ne 1 ]; then
    echo "FAIL ($name): exit $rc, expected 1"; cat "$tmp/out"; exit 1
  fi
  if ! grep -q "^$file:[0-9]*: .*$pattern" "$tmp/out"; then
    echo "FAIL ($name): no violation naming $file ($pattern) in:"; cat "$tmp/out"; exit 1
  fi
  echo "ok ($name): $(grep "^$file:" "$tmp/out" | head -1)"
}

fresh_copy
python3 "$checker" "$tmp/repo" || { echo "FAIL: the unmodified copy does not pass"; exit 1; }

# A graph/ file that includes the trainer.
fresh_copy
sed -i '0,/^#include "/s//#include "train\/trainer.h"\n#include "/' "$tmp/repo/src/graph/ir.cpp"
expect_violation "graph includes train" "src/graph/ir.cpp" 'includes train/trainer.h (folder graph may not include train)'

# A kernels/cuda header that includes its CPU twin.
fresh_copy
sed -i '0,/^#include "/s//#include "kernels\/cpu\/norm.h"\n#include "/' "$tmp/repo/src/kernels/cuda/norm.cuh"
expect_violation "kernels/cuda includes kernels/cpu" "src/kernels/cuda/norm.cuh" \
  'includes kernels/cpu/norm.h (folder kernels/cuda may not include kernels/cpu)'

# The engine reading the run config (it takes the attention backend from kernels/attention_backend.h).
fresh_copy
sed -i '0,/^#include "/s//#include "config\/config.h"\n#include "/' "$tmp/repo/src/engine/executor.cpp"
expect_violation "engine includes config" "src/engine/executor.cpp" 'includes config/config.h (folder engine may not include config)'

# comm/ testing the CUDA build.
fresh_copy
printf '#ifdef AUTOSP_WITH_CUDA\n#endif\n' >>"$tmp/repo/src/comm/threads.cpp"
expect_violation "comm tests AUTOSP_WITH_CUDA" "src/comm/threads.cpp" 'AUTOSP_WITH_CUDA'

echo "check_layers_planted: every planted violation was caught"
