#!/usr/bin/env bash
# autosp-train: the --metrics and --dump-grads contracts, the same first-step gradients from one
# process and from 2 ranks with sequence parallelism 2, checkpoint + resume through the CLI, and
# bad flags / configs / files giving an `error:` line with exit code 2, and a token shard truncated
# mid-run giving exit code 3 naming it; a DeepSpeed config (--deepspeed) applied on 2 ranks.
#   train_cli.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-train
src=$2
py=/usr/bin/python3
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

cat >"$tmp/cfg.json" <<'JSON'
{"model": {"arch": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
 "data": {"source": "synthetic", "seq_len": 30, "batch_size": 2},
 "train": {"steps": 4, "log_every": 1},
 "runtime": {"threads": 1}}
JSON

check() {  # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if ! "$@"; then
    echo "FAIL: $what"
    fail=1
  fi
}

# One process: metrics and gradient dump.
"$bin" --config "$tmp/cfg.json" --metrics "$tmp/m1.jsonl" --dump-grads "$tmp/g1.safetensors" --quiet 2>"$tmp/log1" ||
  { echo "FAIL: single-process run: $(tail -3 "$tmp/log1")"; fail=1; }
check "metrics lines carry the contract's keys" $py - "$tmp/m1.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [1, 2, 3, 4], rows
for r in rows:
    for k in ("step", "loss", "lr", "grad_norm", "tokens_per_sec", "step_ms", "peak_bytes", "accuracy", "tflops",
              "grad_sync_ms", "data_ms", "targets"):
        assert k in r, (k, r)
    assert math.isfinite(r["loss"]) and r["peak_bytes"] > 0 and r["tflops"] > 0 and r["targets"] > 0
    assert "mfu" not in r, r  # a CPU without runtime.peak_tflops has no peak to divide by
PY

# Two ranks, sequence parallel 2 (S = 30 is padded to 30: divisible; use 31 to exercise padding too).
mpirun --oversubscribe -np 2 "$bin" --config "$tmp/cfg.json" --set sequence_parallel.autosp_size=2 \
  --metrics "$tmp/m2.jsonl" --dump-grads "$tmp/g2.safetensors" --quiet 2>"$tmp/log2" ||
  { echo "FAIL: 2-rank run: $(tail -3 "$tmp/log2")"; fail=1; }
check "2-rank SP gradients and losses equal the single-process ones" $py - "$src" "$tmp" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1] + "/tests/ref")
import safetensors_io as st
tmp = sys.argv[2]
g1, _ = st.load(tmp + "/g1.safetensors")
g2, _ = st.load(tmp + "/g2.safetensors")
assert sorted(g1) == sorted(g2) and "model.embed_tokens.weight" in g1 and "lm_head.weight" in g1, sorted(g1)
for k in g1:
    err = (g1[k].double() - g2[k].double()).abs().max().item()
    scale = g1[k].double().abs().max().item()
    assert err <= 1e-5 * scale + 1e-12, (k, err, scale)
l1 = [json.loads(l)["loss"] for l in open(tmp + "/m1.jsonl")]
l2 = [json.loads(l)["loss"] for l in open(tmp + "/m2.jsonl")]
assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(l1, l2)), (l1, l2)
PY

# Checkpoint at step 2, resume to 4: same losses as the uninterrupted run.
"$bin" --config "$tmp/cfg.json" --set train.checkpoint_every=2 --set "train.checkpoint_dir=$tmp/ck" --steps 2 --quiet 2>/dev/null ||
  { echo "FAIL: checkpointing run"; fail=1; }
"$bin" --config "$tmp/cfg.json" --resume "$tmp/ck" --metrics "$tmp/m3.jsonl" --quiet 2>/dev/null ||
  { echo "FAIL: resumed run"; fail=1; }
check "resumed losses equal the uninterrupted run" $py - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
full = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(tmp + "/m1.jsonl")}
res = [json.loads(l) for l in open(tmp + "/m3.jsonl")]
assert [r["step"] for r in res] == [3, 4], res
assert all(r["loss"] == full[r["step"]] for r in res), (res, full)
PY

. "$(dirname "$0")/lib/refusals.sh"
expect_usage_error() { refused "$@"; }  # expect_usage_error NEEDLE COMMAND...
head -c 4000 /dev/urandom >"$tmp/garbage.safetensors"
mkdir -p "$tmp/notackpt"
expect_usage_error "config is required" "$bin"
expect_usage_error "--steps 'many'" "$bin" --config "$tmp/cfg.json" --steps many
expect_usage_error "--steps -1" "$bin" --config "$tmp/cfg.json" --steps -1
# Masks that remove every target (issue 48): a validation without targets reports no loss and no
# accuracy (null both) and warns naming its mask, as training's does; a skipped step reports no
# throughput (it ran nothing).
$py - "$tmp" <<'PY'
import os, struct, sys
d = sys.argv[1]
n = 2000
toks = [(t * 7) % 32 for t in range(n)]
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, n
open(os.path.join(d, "tok.bin"), "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % n, *toks))
h = "{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }" % n
h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
open(os.path.join(d, "zero.npy"), "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + bytes(n))
PY
tok=(--config "$tmp/cfg.json" --set data.source=tokens --set "data.path=$tmp/tok.bin" --set data.seq_len=16 --steps 2)
"$bin" "${tok[@]}" --set "data.val_path=$tmp/tok.bin" --set "data.val_loss_mask_path=$tmp/zero.npy" \
  --set train.eval_every=2 --metrics "$tmp/val0.jsonl" 2>"$tmp/err" &&
  grep -q "warning.*validation after step 2: only 0 of 256 input tokens (0.000%) of data.val_path $tmp/tok.bin are targets: the validation loss masks remove everything (check data.val_loss_mask_path $tmp/zero.npy" "$tmp/err" &&
  grep -q 'step 2/2 | val: no targets' "$tmp/err" && ! grep -q 'val loss\|val acc' "$tmp/err" &&
  $py -c 'import json, sys; m = json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert m["val_loss"] is None and m["val_accuracy"] is None and m["val_targets"] == 0, m' "$tmp/val0.jsonl" ||
  { echo "FAIL: a validation without targets: $(grep -m4 'warn\|val' "$tmp/err")"; fail=1; }
"$bin" "${tok[@]}" --set "data.loss_mask_path=$tmp/zero.npy" --metrics "$tmp/train0.jsonl" 2>"$tmp/err" &&
  [ "$(grep -c 'step [12]/2 | skipped: no targets | lr' "$tmp/err")" -eq 2 ] && ! grep -q 'tok/s\|TFLOP/s' "$tmp/err" &&
  grep -q "warning.*the loss masks remove nearly everything (check data.loss_mask_path $tmp/zero.npy" "$tmp/err" &&
  $py -c 'import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    assert m["skipped"] and m["tokens_per_sec"] is None and m["tflops"] is None and "mfu" not in m and m["tokens"] == 32, m' "$tmp/train0.jsonl" ||
  { echo "FAIL: skipped steps report throughput: $(grep -m3 'step\|warn' "$tmp/err")"; fail=1; }

# A setting the run does not read is one warning naming it (issue 48), here and under --deepspeed.
"$bin" --config "$tmp/cfg.json" --set train.lr_schedule=linear --set train.min_lr=1e-5 --steps 1 --quiet 2>"$tmp/err"
[ "$(grep -c 'warning.*train.min_lr does not apply to train.lr_schedule "linear"' "$tmp/err")" -eq 1 ] ||
  { echo "FAIL: train.min_lr under linear: not one warning: $(grep -m3 warn "$tmp/err")"; fail=1; }
echo '{"gradient_clipping": 1.0}' >"$tmp/ds_clip.json"
"$bin" --config "$tmp/cfg.json" --deepspeed "$tmp/ds_clip.json" --set train.lr_schedule=linear \
  --set train.min_lr=1e-5 --steps 1 --quiet 2>"$tmp/err"
[ "$(grep -c 'warning.*train.min_lr does not apply to train.lr_schedule "linear"' "$tmp/err")" -eq 1 ] ||
  { echo "FAIL: train.min_lr under linear with --deepspeed: not one warning: $(grep -m3 warn "$tmp/err")"; fail=1; }
# --steps is the run's train.steps: a wsd schedule that does not fit train.steps 5 fits --steps 100.
"$bin" --config "$tmp/cfg.json" --set train.steps=5 --set train.lr_schedule=wsd --set train.warmup_steps=4 \
  --set train.decay_fraction=0.5 --steps 100 --print-config >"$tmp/steps.json" 2>"$tmp/err" &&
  $py -c 'import json, sys; assert json.load(open(sys.argv[1]))["train"]["steps"] == 100' "$tmp/steps.json" ||
  { echo "FAIL: --steps 100 over train.steps 5 (wsd): $(head -3 "$tmp/err")"; fail=1; }
expect_usage_error "garbage.safetensors" "$bin" --config "$tmp/cfg.json" --init-from "$tmp/garbage.safetensors"
expect_usage_error "no such checkpoint" "$bin" --config "$tmp/cfg.json" --resume "$tmp/nowhere"
expect_usage_error "holds no checkpoint" "$bin" --config "$tmp/cfg.json" --resume "$tmp/notackpt"
expect_usage_error "exclude each other" "$bin" --config "$tmp/cfg.json" --resume "$tmp/ck" --init-from "$tmp/garbage.safetensors"
expect_usage_error "was written for model" "$bin" --config "$tmp/cfg.json" --set model.hidden_size=64 --resume "$tmp/ck"
expect_usage_error "runtime.dtype" "$bin" --config "$tmp/cfg.json" --set runtime.dtype=bfloat17
expect_usage_error "runtime.device" "$bin" --config "$tmp/cfg.json" --set runtime.device=cuda
expect_usage_error "unknown key 'train.stepz'" "$bin" --config "$tmp/cfg.json" --set train.stepz=3
expect_usage_error "metrics" "$bin" --config "$tmp/cfg.json" --metrics "$tmp/no/such/dir/m.jsonl"
# --dump-grads' directory is checked before the run starts (not after step 1: exit 3); a run with no
# step writes no gradients, and says so.
expect_usage_error "--dump-grads $tmp/no/such/dir/g.safetensors: $tmp/no/such/dir is not a directory" \
  "$bin" --config "$tmp/cfg.json" --dump-grads "$tmp/no/such/dir/g.safetensors"
"$bin" --config "$tmp/cfg.json" --steps 0 --dump-grads "$tmp/g0.safetensors" >/dev/null 2>"$tmp/log0" ||
  { echo "FAIL: --steps 0 --dump-grads: $(tail -3 "$tmp/log0")"; fail=1; }
check "--steps 0 --dump-grads: nothing written, and a line says so" bash -c \
  "[ ! -e '$tmp/g0.safetensors' ] && grep -q 'warning.*--dump-grads $tmp/g0.safetensors: not written: no step runs (steps 0..0)' '$tmp/log0'"
expect_usage_error "does not divide the world size" mpirun --oversubscribe -np 2 "$bin" --config "$tmp/cfg.json" --set sequence_parallel.autosp_size=4
expect_usage_error "attention heads" mpirun --oversubscribe -np 2 "$bin" --config "$tmp/cfg.json" --set sequence_parallel.autosp_size=2 --set model.num_attention_heads=1 --set model.num_key_value_heads=1

# DeepSpeedExamples' AutoSP config as it is (--deepspeed) on 2 ranks: SP 2, micro-batch 1, bf16; the
# run config gives the model and data only (no batch size or log_every: the file sets them). The log
# names what was mapped and, once, what was ignored.
$py -c 'import json, sys; c = json.load(open(sys.argv[1])); del c["data"]["batch_size"], c["train"]["log_every"]; c["train"]["steps"] = 2
json.dump(c, open(sys.argv[2], "w"))' "$tmp/cfg.json" "$tmp/cfg_ds.json"
mpirun --oversubscribe -np 2 "$bin" --config "$tmp/cfg_ds.json" --deepspeed "$src/configs/deepspeed/autosp.json" \
  --metrics "$tmp/m_ds.jsonl" 2>"$tmp/log_ds" >/dev/null ||
  { echo "FAIL: --deepspeed configs/deepspeed/autosp.json on 2 ranks: $(tail -3 "$tmp/log_ds")"; fail=1; }
check "--deepspeed: the mapping is logged" grep -q 'DeepSpeed keys applied: sequence_parallel_size → sequence_parallel.autosp_size 2' "$tmp/log_ds"
check "--deepspeed: keys not used listed once" test "$(grep -c 'not used by autosp (they change nothing here): wall_clock_breakdown' "$tmp/log_ds")" -eq 1
check "--deepspeed: the recipe, once, with its sources" test "$(grep -c 'recipe (each value ← where it came from):' "$tmp/log_ds")" -eq 1
check "--deepspeed: no scheduler is a constant lr" grep -q '^  lr schedule: constant ← DeepSpeed.s default: no scheduler section' "$tmp/log_ds"
check "--deepspeed: the batch from the file" grep -q '^  batch: micro-batch 1 ← .*autosp.json train_micro_batch_size_per_gpu' "$tmp/log_ds"
check "--deepspeed: bf16, batch 1 in the resolved config" grep -q '"batch_size":1,.*"dtype":"bfloat16"' "$tmp/log_ds"
check "--deepspeed: 2 metrics rows" test "$(wc -l <"$tmp/m_ds.jsonl")" -eq 2

# Real text: the end-of-run example is one short line of decoded text (the model's next tokens
# against the data's), and runtime.peak_tflops gives every metrics row an MFU.
for i in $(seq 40); do printf 'the cat sat on the mat.\nthe dog sat on the log.\n'; done >"$tmp/text.txt"
"$bin" --config "$tmp/cfg.json" --set model.vocab_size=256 --set data.source=text --set data.path="$tmp/text.txt" \
  --set data.val_path="$tmp/text.txt" --set train.eval_every=4 --set train.eval_batches=1 --set data.seq_len=48 \
  --set runtime.peak_tflops=1 --metrics "$tmp/m_text.jsonl" 2>"$tmp/log_text" >/dev/null ||
  { echo "FAIL: text run: $(tail -3 "$tmp/log_text")"; fail=1; }
check "the example is decoded text" grep -q 'example: ".*" → model ".*" | data ".*"' "$tmp/log_text"
check "the example is one short line" test "$(grep 'example:' "$tmp/log_text" | wc -c)" -lt 600
check "runtime.peak_tflops gives an MFU" $py -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows and all(0 < r["mfu"] < 1 for r in rows), rows' "$tmp/m_text.jsonl"

# A rank thread that cannot start (here the address-space limit stops thread ~100 of 1024) ends
# the job with exit 3 naming it, after the ranks already running have stopped (it once let the
# exception unwind past joinable threads: std::terminate, SIGABRT). Not under ASan, whose shadow
# memory needs more address space than the limit.
if [ -z "${ASAN_OPTIONS:-}" ]; then
  (ulimit -v 3000000 && timeout -k 5 60 "$bin" --config "$tmp/cfg.json" --steps 1 --thread-ranks 1024 --quiet) \
    >"$tmp/threads.log" 2>&1
  rc=$?
  if [ $rc -ne 3 ] || ! grep -q '^error: --thread-ranks 1024: rank thread [0-9]* could not start' "$tmp/threads.log"; then
    echo "FAIL: --thread-ranks 1024 under ulimit -v: exit $rc, expected 3 with a 'could not start' line:"
    tail -3 "$tmp/threads.log"
    fail=1
  fi
fi

# A token shard truncated while the run reads it (issue 31): exit 3 naming the shard, not a SIGBUS
# (exit 135, no message). The run has far more steps than it can take in the time limit; a
# background subshell truncates the shard once the metrics file shows step 1, and the next batch
# must find it. 4096 uint16 tokens: the reads soon leave the first page, all that a truncated
# file keeps mapped.
$py - "$tmp/shard.bin" <<'PY'
import struct, sys
n = 4096
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<3i", 20240520, 1, n) + bytes(1012) + struct.pack(f"<{n}H", *(i % 32 for i in range(n))))
PY
# A list in one --set stays whole (cxxopts split vector values at commas): data.mix from the command line.
cp "$tmp/shard.bin" "$tmp/shard2.bin"
"$bin" --config "$tmp/cfg.json" --set data.source=tokens --steps 1 \
  --set "data.mix=[{\"path\": \"$tmp/shard.bin\", \"weight\": 0.7}, {\"path\": \"$tmp/shard2.bin\", \"weight\": 0.3}]" \
  >/dev/null 2>"$tmp/log_mix"
check "--set data.mix=[{...}, {...}] is one value (a mix of 2 datasets, 70%)" grep -q "data: mix of 2 datasets: 70% tokens" "$tmp/log_mix"
(
  for _ in $(seq 600); do
    [ -s "$tmp/mt.jsonl" ] && break
    sleep 0.05
  done
  truncate -s 1024 "$tmp/shard.bin"
) &
timeout 60 "$bin" --config "$tmp/cfg.json" --set data.source=tokens --set "data.path=$tmp/shard.bin" \
  --steps 1000000 --set train.log_every=1 --metrics "$tmp/mt.jsonl" --quiet >/dev/null 2>"$tmp/err"
rc=$?
wait
if [ $rc -ne 3 ] || ! grep -q "^error: $tmp/shard.bin: the data file changed while the run read it (was 9216 bytes, now 1024 bytes)" "$tmp/err"; then
  echo "FAIL: a shard truncated during the run: exit $rc with: $(grep -m3 . "$tmp/err") (expected exit 3 naming the shard)"
  fail=1
fi

if [ $fail -eq 0 ]; then echo "train_cli: all checks passed"; fi
exit $fail
