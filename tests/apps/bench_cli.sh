#!/usr/bin/env bash
# autosp-bench: a small forward benchmark prints one JSON row with a finite loss; bad flags and
# configs give one `error:` line and exit code 2.
#   bench_cli.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-bench
src=$2
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$("$bin" --config "$src/configs/llama-tiny.json" --set data.seq_len=32 --set data.batch_size=1 --iters 1 --warmup 0) || {
  echo "FAIL: bench exited non-zero"
  fail=1
}
if ! /usr/bin/python3 -c 'import json,math,sys; r=json.loads(sys.argv[1]); assert r["impl"]=="autosp" and math.isfinite(r["loss"]) and 4.5 < r["loss"] < 7 and r["tokens_per_sec"] > 0 and r["peak_bytes"] > 0, r' "$out"; then
  echo "FAIL: bench row: $out"
  fail=1
fi

expect_usage_error() {  # expect_usage_error NEEDLE ARGS...
  local needle=$1
  shift
  "$bin" "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -q "^error: .*$needle" "$tmp/err"; then
    echo "FAIL: autosp-bench $* exited $rc with: $(cat "$tmp/err") (expected exit 2, one 'error:' line naming '$needle')"
    fail=1
  fi
}
expect_usage_error "config is required"
expect_usage_error "--mode" --config "$src/configs/llama-tiny.json" --mode sideways
expect_usage_error "--iters" --config "$src/configs/llama-tiny.json" --iters 0
expect_usage_error "iters" --config "$src/configs/llama-tiny.json" --iters lots
expect_usage_error "data.seq_len" --config "$src/configs/llama-tiny.json" --set data.seq_len=-3

if [ $fail -eq 0 ]; then echo "bench_cli: all checks passed"; fi
exit $fail
