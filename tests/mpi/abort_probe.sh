#!/usr/bin/env bash
# Runs abort_probe on 2 ranks: the job must end (ctest's TIMEOUT catches a hang) with exit code 3
# (the code rank 1 passed to abort()), its "error: probe" line, and within 30 seconds.
# Usage: abort_probe.sh <mpiexec> <abort-probe binary> [mpiexec flags...]
set -u
mpiexec=$1 probe=$2
shift 2
start=$SECONDS
out=$("$mpiexec" "$@" -np 2 "$probe" 2>&1)
rc=$?
elapsed=$((SECONDS - start))
printf '%s\n' "$out"
echo "abort_probe.sh: exit code $rc after ${elapsed}s"
fail=0
if [ "$rc" -ne 3 ]; then echo "FAIL: exit code $rc, expected abort()'s 3"; fail=1; fi
if ! grep -q '^error: probe$' <<<"$out"; then echo "FAIL: no 'error: probe' line"; fail=1; fi
if grep -q 'passed the barrier' <<<"$out"; then echo "FAIL: rank 0 left the barrier"; fail=1; fi
if [ "$elapsed" -gt 30 ]; then echo "FAIL: took ${elapsed}s"; fail=1; fi
exit $fail
