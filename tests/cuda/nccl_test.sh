#!/usr/bin/env bash
# Runs autosp-nccl-test under mpirun with NP ranks, one GPU each; exit 77 (ctest: skipped) when
# this machine has fewer CUDA devices than NP (or none), checked before mpirun starts.
#   nccl_test.sh NP MPIEXEC BIN [mpirun flags...]
set -u
np=$1 mpiexec=$2 bin=$3
shift 3
if ! n=$(timeout 60 "$bin" --device-count 2>/dev/null); then
  echo "no CUDA device: skipping"
  exit 77
fi
if [ "$n" -lt "$np" ]; then
  echo "$n CUDA device(s), fewer than $np ranks: skipping"
  exit 77
fi
exec timeout 300 "$mpiexec" "$@" -np "$np" "$bin"
