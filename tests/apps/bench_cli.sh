#!/usr/bin/env bash
# autosp-bench: a small forward benchmark prints one JSON row with a finite loss; a tiny attention
# benchmark prints its row (no PyTorch needed without --compare-pytorch); the GEMM benchmark prints
# its 20 rows, ours agreeing with OpenBLAS and a bf16 column; the PyTorch baseline's bf16 (autocast)
# step; the ring benchmark its two layouts' rows; a tiny sweep
# (P = 1 in-process child, P = 2 under mpirun) writes CSV and JSON-lines rows with the
# communication columns; --project prints the scaling tables; bad flags and configs give one
# `error:` line and exit code 2.
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

. "$(dirname "$0")/lib/refusals.sh"
expect_usage_error() { refused_alone "$1" "$bin" "${@:2}"; }  # expect_usage_error NEEDLE ARGS...
expect_usage_error "config is required"
expect_usage_error "--mode" --config "$src/configs/llama-tiny.json" --mode sideways
expect_usage_error "--iters" --config "$src/configs/llama-tiny.json" --iters 0
expect_usage_error "iters" --config "$src/configs/llama-tiny.json" --iters lots
expect_usage_error "data.seq_len" --config "$src/configs/llama-tiny.json" --set data.seq_len=-3


# Sweep flags.
cfg=$src/configs/llama-tiny.json
expect_usage_error "--sweep-seq" --config "$cfg" --sweep-seq abc
expect_usage_error "--sweep-seq" --config "$cfg" --sweep-seq 0
expect_usage_error "--sweep-seq" --config "$cfg" --sweep-seq 64,
expect_usage_error "--sweep-seq" --config "$cfg" --sweep-seq=-64
expect_usage_error "--sweep-ranks" --config "$cfg" --sweep-seq 64 --sweep-ranks two
expect_usage_error "P = 3" --config "$cfg" --sweep-seq 64 --sweep-ranks 3
expect_usage_error "--out" --config "$cfg" --sweep-seq 64 --out "$tmp/rows.txt"
expect_usage_error "--out" --config "$cfg" --sweep-seq 64 --out "$tmp/no/such/dir/rows.csv"
expect_usage_error "nope.json" --models "$tmp/nope.json" --sweep-seq 64
expect_usage_error "--models" --models "$cfg,," --sweep-seq 64
expect_usage_error "--models replaces --config" --config "$cfg" --models "$cfg" --sweep-seq 64
expect_usage_error "--config or --models" --sweep-seq 64
expect_usage_error "--mode" --config "$cfg" --sweep-seq 64 --mode sideways
expect_usage_error "not a multiple of P = 2" --config "$cfg" --sweep-seq 63 --sweep-ranks 2 --mode forward
expect_usage_error "exclude" --config "$cfg" --sweep-seq 64 --point
# The attention benchmark (without PyTorch: ours and sgemm only) and its flags.
row=$("$bin" --mode attention --attn-seq 64 --attn-dims 16 --pairs 1 --iters 1 --warmup 0 2>/dev/null) || {
  echo "FAIL: --mode attention exited non-zero"
  fail=1
}
if ! /usr/bin/python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["mode"]=="attention" and r["S"]==64 and r["D"]==16 and r["N"]==16 and r["Nkv"]==8 and r["ours_gflops"]>0 and r["sgemm_gflops"]>0 and "speedup" not in r, r' "$row"; then
  echo "FAIL: attention row: $row"
  fail=1
fi
expect_usage_error "--attn-dims 48" --mode attention --attn-dims 48
expect_usage_error "--attn-seq" --mode attention --attn-seq 0
expect_usage_error "--mode attention takes no --config" --mode attention --config "$cfg"
expect_usage_error "need --compare-pytorch" --config "$cfg" --pytorch-compile
expect_usage_error "leave train.gradient_accumulation_steps at 1" --config "$cfg" --compare-pytorch \
  --set train.gradient_accumulation_steps=2
# The PyTorch baseline in bf16 (torch.autocast; Debian's 1.13 has it too): one tiny step, its row
# says bfloat16 and has a finite loss; a bad --dtype is refused (argparse: exit 2).
row=$(/usr/bin/python3 "$src/scripts/bench_pytorch.py" --arch llama --layers 1 --hidden 32 --heads 4 --kv-heads 2 \
  --intermediate 48 --vocab 64 --batch 1 --seq 16 --threads 1 --attention math --dtype bfloat16 --warmup 0 --iters 1 \
  2>/dev/null | tail -1)
if ! /usr/bin/python3 -c 'import json,math,sys; r=json.loads(sys.argv[1]); assert r["dtype"]=="bfloat16" and math.isfinite(r["final_loss"]), r' "$row"; then
  echo "FAIL: bench_pytorch.py --dtype bfloat16: $row"
  fail=1
fi
/usr/bin/python3 "$src/scripts/bench_pytorch.py" --dtype float16 >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q "dtype" "$tmp/err"; then
  echo "FAIL: bench_pytorch.py --dtype float16: exit $rc, $(cat "$tmp/err")"
  fail=1
fi
# The GEMM benchmark (ours against OpenBLAS) and its flags.
rows=$("$bin" --mode gemm --pairs 1 --iters 1 --warmup 0 --threads 2 2>/dev/null) || {
  echo "FAIL: --mode gemm exited non-zero"
  fail=1
}
if ! /usr/bin/python3 -c 'import json,sys; rs=[json.loads(l) for l in sys.argv[1].splitlines()]; assert len(rs)==20 and all(r["mode"]=="gemm" and r["ours_gflops"]>0 and r["openblas_gflops"]>0 and r["max_rel_diff"]<1e-5 and r["bf16_gflops"]>0 and r["bf16_path"] for r in rs), rs' "$rows"; then
  echo "FAIL: gemm rows: $rows"
  fail=1
fi
expect_usage_error "--mode gemm takes no --config" --mode gemm --config "$cfg"
expect_usage_error "--pairs" --mode gemm --pairs 0
# The ring balance benchmark: a zigzag and a contiguous row, one time per ring rank (timings are
# not asserted: a benchmark, not a timed test).
rows=$("$bin" --mode ring --attn-seq 256 --ring-sizes 4 --attn-hidden 64 --attn-dims 16 --pairs 1 --iters 1 --warmup 0 2>/dev/null) || {
  echo "FAIL: --mode ring exited non-zero"
  fail=1
}
if ! /usr/bin/python3 -c 'import json,sys; rs=[json.loads(l) for l in sys.argv[1].splitlines()]; assert [r["layout"] for r in rs]==["zigzag","contiguous"] and all(r["ring"]==4 and r["seq"]==256 and len(r["rank_ms"])==4 and min(r["rank_ms"])>0 and r["max_over_mean"]>=1 for r in rs) and "slowest_vs_zigzag" in rs[1], rs' "$rows"; then
  echo "FAIL: ring rows: $rows"
  fail=1
fi
# With --attn-window: the zigzag ring without and with the window; the windowed one sends less
# (S 256, R 4: chunks of 32; w 16 reaches 15 keys of one neighbour chunk per side).
rows=$("$bin" --mode ring --attn-seq 256 --ring-sizes 4 --attn-hidden 64 --attn-dims 16 --attn-window 16 --pairs 1 --iters 1 --warmup 0 2>/dev/null) || {
  echo "FAIL: --mode ring --attn-window exited non-zero"
  fail=1
}
if ! /usr/bin/python3 -c 'import json,sys; rs=[json.loads(l) for l in sys.argv[1].splitlines()]; assert [r["window"] for r in rs]==[0,16] and all(len(r["bytes_per_rank"])==4 for r in rs) and all(w*4<f for w,f in zip(rs[1]["bytes_per_rank"],rs[0]["bytes_per_rank"])), rs' "$rows"; then
  echo "FAIL: windowed ring rows: $rows"
  fail=1
fi
expect_usage_error "--attn-window" --mode ring --attn-window 0
expect_usage_error "--attn-window" --mode ring --attn-window many
expect_usage_error "S a multiple of 2R" --mode ring --attn-seq 1000 --ring-sizes 3
expect_usage_error "R ≥ 2" --mode ring --attn-seq 1024 --ring-sizes 1
expect_usage_error "not a --mode ring flag" --mode ring --attn-full
expect_usage_error "--mode ring takes no --config" --mode ring --config "$cfg"
expect_usage_error "hidden 100 is not heads" --mode ring --attn-hidden 100 --attn-dims 16
# Projection flags.
echo '{"gpu": 8}' >"$tmp/proj-bad.json"
echo '{"links": {"nvlink": {"alpha_us": "fast"}}}' >"$tmp/proj-bad2.json"
expect_usage_error "gpu: unknown key" --project --project-config "$tmp/proj-bad.json"
expect_usage_error "links.nvlink.alpha_us" --project --project-config "$tmp/proj-bad2.json"
expect_usage_error "cannot open" --project --project-config "$tmp/none.json"
expect_usage_error "--compute-tflops" --project --compute-tflops -3
expect_usage_error "--compute-tflops" --project --compute-tflops lots
expect_usage_error "needs --project" --compute-tflops 3
expect_usage_error "exclude" --project --sweep-seq 64
expect_usage_error "--project" --project --config "$cfg"
expect_usage_error "exclude each other" --project --compute-tflops 3 --compute-from "$tmp/x.jsonl"
expect_usage_error "no P = 1 step row" --project --compute-from "$tmp/proj-bad.json"

# A tiny sweep: CSV with a header and one row per point; the P = 2 rows (MPI builds: the build
# has autosp-mpi-tests) count all-to-all and all-reduce bytes; the JSON-lines form feeds
# --project --compute-from.
ranks=1
[ -x "$1/autosp-mpi-tests" ] && ranks=1,2
if "$bin" --config "$cfg" --set data.batch_size=1 --sweep-seq 32,64 --sweep-ranks $ranks --warmup 0 --iters 1 \
    --out "$tmp/rows.csv" >"$tmp/rows.stdout" 2>"$tmp/sweep.err"; then
  if ! /usr/bin/python3 - "$tmp/rows.csv" "$tmp/rows.stdout" "$ranks" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
points = [(p, s) for p in sys.argv[3].split(",") for s in ("32", "64")]
assert [(r["P"], r["seq"]) for r in rows] == points, rows
for r in rows:
    assert r["model"] == "llama-tiny" and float(r["tokens_per_sec"]) > 0 and float(r["tflops"]) > 0, r
    assert r["mfu"] == "" and int(r["peak_bytes"]) > 0 and r["error"] == "", r
    p2 = r["P"] == "2"
    assert (int(r["all_to_all_bytes"]) > 0) == p2 and (int(r["all_reduce_bytes"]) > 0) == p2, r
    # comm_share counts every collective's wall time, waiting for the slower rank included (also the
    # between-steps agreement on a preemption signal), so on an oversubscribed machine it can pass 1
    assert 0 <= float(r["comm_share"]), r
if len(rows) == 4:
    # llama-tiny, sp 2, B 1, S 64: 2 layers x 2 directions x (2 x 8 + 2 x 4 heads) x 1*(64/2)*16*4/2 bytes;
    # gradients (361088 f32) + the loss scalars (no accuracy counts: the bench does not score the task)
    assert int(rows[3]["all_to_all_bytes"]) == 2 * 2 * (2 * 8 + 2 * 4) * 32 * 16 * 4 // 2, rows[3]
    # + 8: the preemption-stop agreement (i64[1], train/preempt.h) each step; + 8: the step's
    # target count (i64[1], train/accumulation.h)
    assert int(rows[3]["all_reduce_bytes"]) == 361088 * 4 + 8 + 8 + 8, rows[3]
lines = [json.loads(l) for l in open(sys.argv[2])]
assert [(str(l["P"]), str(l["seq"])) for l in lines] == points, lines
PY
  then
    echo "FAIL: sweep rows: $(cat "$tmp/rows.csv")"
    fail=1
  fi
  # The plots (when Debian's python3-matplotlib is installed: scripts/setup.sh installs it).
  if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
    if ! /usr/bin/python3 "$src/scripts/plot_bench.py" "$tmp/rows.csv" --out-dir "$tmp/plots" >/dev/null ||
       [ ! -s "$tmp/plots/llama-tiny-throughput.png" ] || [ ! -s "$tmp/plots/llama-tiny-memory.png" ]; then
      echo "FAIL: plot_bench.py did not write the PNGs"
      fail=1
    fi
  fi
else
  echo "FAIL: sweep exited non-zero: $(cat "$tmp/sweep.err")"
  fail=1
fi
if "$bin" --config "$cfg" --set data.batch_size=1 --sweep-seq 32 --warmup 0 --iters 1 --out "$tmp/rows.jsonl" >/dev/null 2>&1; then
  proj=$("$bin" --project --compute-from "$tmp/rows.jsonl") || { echo "FAIL: --project --compute-from exited non-zero"; fail=1; }
  if ! grep -q "compute measured in" <<<"$proj"; then echo "FAIL: --compute-from not used: $proj"; fail=1; fi
else
  echo "FAIL: jsonl sweep exited non-zero"
  fail=1
fi

# The projection: the documented GPU counts, 64 GPUs as dp 2 x sp 32 (32 heads), and the
# shipped parameter file equals the built-in defaults.
proj=$("$bin" --project) || { echo "FAIL: --project exited non-zero"; fail=1; }
for needle in "| 8 | 8 × 1 |" "| 64 | 32 × 2 |" "Longest trainable sequence"; do
  grep -qF "$needle" <<<"$proj" || { echo "FAIL: --project lacks '$needle'"; fail=1; }
done
if ! diff <(tail -n +2 <<<"$proj") <("$bin" --project --project-config "$src/docs/projection-llama3-8b-h200.json" | tail -n +2) >/dev/null; then
  echo "FAIL: docs/projection-llama3-8b-h200.json differs from the built-in defaults"
  fail=1
fi

if [ $fail -eq 0 ]; then echo "bench_cli: all checks passed"; fi
exit $fail
