#!/usr/bin/env bash
# scripts/plot_metrics.py on real output: two autosp-train --metrics runs (with validation) and two
# autosp-eval --perplexity-by-position files and a --passkey file give the PNGs its help names, each a PNG image; input
# that is not one of its kinds (garbage, a bench CSV, JSON of another shape, a missing file,
# --labels of the wrong count) is an `error:` line and exit 2.
#   plot_metrics.sh BIN_DIR SOURCE_DIR
set -u
bin=$1
src=$2
py=/usr/bin/python3
plot=$src/scripts/plot_metrics.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
unset AUTOSP_FAULT
fail=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}
cat >"$tmp/cfg.json" <<'JSON'
{"model": {"arch": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
 "data": {"source": "synthetic", "seq_len": 16, "batch_size": 2},
 "train": {"steps": 4, "log_every": 1, "eval_every": 2, "eval_batches": 1, "warmup_steps": 1},
 "runtime": {"threads": 1}}
JSON
for lr in 1e-3 3e-3; do
  "$bin/autosp-train" --config "$tmp/cfg.json" --set train.lr=$lr --metrics "$tmp/lr$lr.jsonl" --quiet 2>/dev/null ||
    { echo "FAIL: autosp-train lr $lr"; fail=1; }
  "$bin/autosp-eval" --config "$tmp/cfg.json" --set train.lr=$lr --perplexity-by-position --bucket-width 4 \
    --sequences 2 --quiet --out "$tmp/eval$lr.json" 2>/dev/null || { echo "FAIL: autosp-eval"; fail=1; }
done
$py -c "open('$tmp/t.txt', 'w').write('hello world. ' * 100)"
"$bin/autosp-eval" --config "$tmp/cfg.json" --set model.vocab_size=256 --set data.source=text --set "data.path=$tmp/t.txt" --set train.eval_every=0 \
  --passkey --passkey-lengths 120,200 --passkey-depths 0,1 --passkey-trials 1 --quiet --out "$tmp/pk.json" 2>/dev/null ||
  { echo "FAIL: autosp-eval --passkey"; fail=1; }
$py "$plot" "$tmp/lr1e-3.jsonl" "$tmp/lr3e-3.jsonl" "$tmp/eval1e-3.json" "$tmp/eval3e-3.json" "$tmp/pk.json" \
  --labels a,b,before,after,pk --out-dir "$tmp/png" --prefix run- >"$tmp/written" 2>"$tmp/err"
check "plot_metrics.py ran" [ $? = 0 ]
expected="loss lr grad-norm throughput perplexity-by-position passkey"
for name in $expected; do
  check "run-$name.png is a PNG" $py -c "
import sys; d = open('$tmp/png/run-$name.png', 'rb').read(); sys.exit(0 if d[:8] == b'\x89PNG\r\n\x1a\n' and len(d) > 2000 else 1)"
done
check "it prints the paths it wrote" [ "$(wc -l <"$tmp/written")" = 6 ]
# A run killed while writing leaves its last line cut short: the rows before it are plotted, with a
# warning that says so.
head -c -9 "$tmp/lr1e-3.jsonl" >"$tmp/cut.jsonl"
$py "$plot" "$tmp/cut.jsonl" --out-dir "$tmp/cut" >/dev/null 2>"$tmp/cut.err"
check "a cut-short last line is plotted around" [ $? = 0 ]
check "with a warning naming the line" grep -q "cut.jsonl: line 4 is cut short .*plotting the 3 rows before it" "$tmp/cut.err"

. "$(dirname "$0")/lib/refusals.sh"
bad() { refused "$1" $py "$plot" "${@:2}" --out-dir "$tmp/bad"; }  # bad TEXT ARGS...
printf '\x00\x01garbage' >"$tmp/garbage.jsonl"
printf 'P,seq\n1,2\n' >"$tmp/bench.csv"
echo '{"task": "perplexity_by_position", "buckets": [{"start": "x"}]}' >"$tmp/shape.json"
echo '{"step": "one"}' >"$tmp/nostep.jsonl"
echo '{"task": "passkey", "cells": [{"length": 8, "depth": 0.5}]}' >"$tmp/pk_bad.json"
bad "garbage.jsonl: line 1: not JSON" "$tmp/garbage.jsonl"
{ head -1 "$tmp/lr1e-3.jsonl"; echo '{"step": 2, "loss'; tail -1 "$tmp/lr1e-3.jsonl"; } >"$tmp/mid.jsonl"
bad "mid.jsonl: line 2: not JSON" "$tmp/mid.jsonl"
bad "bench.csv: not JSON" "$tmp/bench.csv"
bad "perplexity_by_position without buckets" "$tmp/shape.json"
bad "expected autosp-train --metrics lines" "$tmp/nostep.jsonl"
bad "missing.jsonl" "$tmp/missing.jsonl"
bad "passkey without cells of length, depth and accuracy" "$tmp/pk_bad.json"
bad "--labels: 1 names for 2 files" "$tmp/lr1e-3.jsonl" "$tmp/lr3e-3.jsonl" --labels one
exit $fail
