#!/usr/bin/env bash
# scripts/kernel_ab.sh: HEAD's attention against the working tree's, one round at a tiny size,
# prints its line with two finite, positive ratios; the GEMM form prints its summary line; no
# arguments, an unknown kernel and a revision that does not exist each exit with code 2 (the last
# two with one `error:` line).
#   kernel_ab.sh BIN_DIR SOURCE_DIR
set -u
src=$2
ab=$src/scripts/kernel_ab.sh
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -d /usr/lib/x86_64-linux-gnu/openblas-openmp ] || { echo "SKIP: no OpenBLAS OpenMP build"; exit 77; }
git -C "$src" rev-parse HEAD >/dev/null 2>&1 || { echo "SKIP: not a git checkout"; exit 77; }

out=$(bash "$ab" HEAD attention 1 64 16 2>&1) || { echo "FAIL: attention run exited non-zero: $out"; fail=1; }
if ! echo "$out" | tail -1 | grep -Eq '^attention B 4 N 8 S 64 D 16, best of 1: forward old [0-9.]+ new [0-9.]+ ms \([0-9.]+x\), backward old [0-9.]+ new [0-9.]+ ms \([0-9.]+x\)$'; then
  echo "FAIL: attention line: $out"
  fail=1
fi
out=$(bash "$ab" HEAD gemm 1 2>&1) || { echo "FAIL: gemm run exited non-zero: $out"; fail=1; }
if ! echo "$out" | tail -1 | grep -Eq "^the step's GEMMs, best of 1: old [0-9.]+ ms, new [0-9.]+ ms: [0-9.]+x$"; then
  echo "FAIL: gemm line: $out"
  fail=1
fi

expect_error() {  # expect_error NEEDLE ARGS...
  local needle=$1
  shift
  bash "$ab" "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  local err
  err=$(cat "$tmp/err")
  if [ $rc -ne 2 ] || ! echo "$err" | grep -q "^error: kernel_ab: .*$needle"; then
    echo "FAIL: kernel_ab.sh $* gave rc $rc: $err"
    fail=1
  fi
}
expect_error "unknown kernel 'softmax'" HEAD softmax 1
expect_error "no src/kernels/cpu/matmul.cpp at no-such-revision" no-such-revision gemm 1
bash "$ab" >/dev/null 2>&1
[ $? -eq 2 ] || { echo "FAIL: no arguments should exit 2"; fail=1; }
exit $fail
