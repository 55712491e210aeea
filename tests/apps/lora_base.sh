#!/usr/bin/env bash
# A LoRA checkpoint and its base (decision 289), through the real autosp-train, and what a PEFT
# adapter directory may hold (decision 290):
#   - a LoRA run's meta.json records its base ("lora_base": model.from's path and a fingerprint);
#   - --resume with the same model.from continues the run (step 2's loss as the uninterrupted run's),
#     with the same weights at another path too;
#   - --resume without model.from, or with another base (same architecture, other weights), exits 2
#     with an `error:` line naming model.from and the base the checkpoint needs, and writes no
#     step_* into the checkpoint directory; a run on a random (seeded) base resumes as before and
#     refuses a model.from; a checkpoint from before the record resumes with a warning;
#   - --dump-grads under LoRA writes the adapter checkpoint's names (PEFT's keys);
#   - lora.from: an adapter_config.json key PEFT does not know gets a warning naming it; a setting
#     that changes the math (lora_bias) is refused naming it.
# Two full one-step runs make the bases: a full run's step_N is a Hugging Face model directory.
#   lora_base.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-train
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
unset AUTOSP_FAULT
fail=0
source "$2/tests/apps/lib/refusals.sh"
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }

cat >"$tmp/cfg.json" <<'JSON'
{"model": {"arch": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
 "data": {"source": "synthetic", "seq_len": 16, "batch_size": 2},
 "train": {"steps": 2, "log_every": 1, "lr": 0.01, "checkpoint_every": 1},
 "runtime": {"threads": 1}}
JSON
train() { "$bin" --config "$tmp/cfg.json" --quiet "$@"; }
# step N's loss in a metrics file
loss_at() { $py -c "import json,sys; print([json.loads(l)['loss'] for l in open(sys.argv[1]) if json.loads(l)['step'] == int(sys.argv[2])][0])" "$1" "$2"; }
steps_in() { (cd "$1" && ls -d step_* 2>/dev/null | tr '\n' ' '); }

# Two bases of the same architecture with other weights (another seed).
train --steps 1 --set train.checkpoint_dir="$tmp/full_a" >/dev/null 2>&1 &&
  train --steps 1 --set train.seed=7 --set train.checkpoint_dir="$tmp/full_b" >/dev/null 2>&1 ||
  { echo "FAIL: the full runs that make the bases"; exit 1; }
base_a=$tmp/full_a/step_00000001
base_b=$tmp/full_b/step_00000001
lora=(--set lora.r=4 --set model.from="$base_a")

# The uninterrupted LoRA run on base A, and its checkpoints.
train "${lora[@]}" --set train.checkpoint_dir="$tmp/run" --metrics "$tmp/run.jsonl" --dump-grads "$tmp/grads.safetensors" \
  >/dev/null 2>"$tmp/run.err" || { echo "FAIL: the LoRA run: $(cat "$tmp/run.err")"; exit 1; }
$py - "$tmp/run/step_00000001/meta.json" "$base_a" <<'PY' && ok "meta.json records the base" || bad "meta.json's lora_base"
import json, sys
b = json.load(open(sys.argv[1]))["lora_base"]
assert b["source"] == "model.from" and b["path"] == sys.argv[2], b
assert len(b["fingerprint"]) == 8 and b["tensors"] == 12 and b["elements"] > 0, b
PY

# --dump-grads: the names of the adapter checkpoint (PEFT's keys), read from both files' headers.
$py - "$tmp/grads.safetensors" "$tmp/run/step_00000001/adapter_model.safetensors" <<'PY' \
  && ok "--dump-grads writes the adapter's names" || bad "--dump-grads' names are not the adapter checkpoint's"
import json, struct, sys
def names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return sorted(k for k in json.loads(f.read(n)) if k != "__metadata__")
got, want = names(sys.argv[1]), names(sys.argv[2])
assert got == want and len(got) == 4 and got[0].startswith("base_model.model.model.layers.0."), (got, want)
PY

# The same base continues the run: step 2 as the uninterrupted run's.
train "${lora[@]}" --resume "$tmp/run/step_00000001" --set train.checkpoint_dir="$tmp/again" --metrics "$tmp/again.jsonl" \
  >/dev/null 2>"$tmp/again.err"
if [ $? -eq 0 ] && [ "$(loss_at "$tmp/again.jsonl" 2)" = "$(loss_at "$tmp/run.jsonl" 2)" ]; then
  ok "a resume on the same base continues the run (step 2's loss $(loss_at "$tmp/run.jsonl" 2))"
else
  bad "a resume on the same base: $(cat "$tmp/again.err")"
fi

# Without model.from, or on another base: refused, and nothing written into the run's directory.
before=$(steps_in "$tmp/run")
refused "model.from must give that base; set model.from \"$base_a\" to continue that run" \
  "$bin" --config "$tmp/cfg.json" --set lora.r=4 --resume "$tmp/run" --steps 3 --set train.checkpoint_dir="$tmp/run"
grep -q "this run has no model.from" "$tmp/refusal_err" || bad "the refusal does not say the run has no model.from"
refused "this run's base, model.from \"$base_b\", holds other weights" \
  "$bin" --config "$tmp/cfg.json" --set lora.r=4 --set model.from="$base_b" --resume "$tmp/run" --steps 3 \
  --set train.checkpoint_dir="$tmp/run"
[ "$(steps_in "$tmp/run")" = "$before" ] && ok "the refused resumes wrote no checkpoint ($before)" \
  || bad "the refused resumes changed $tmp/run: $before -> $(steps_in "$tmp/run")"

# The same weights at another path: accepted (the fingerprint decides), with a line saying so.
cp -r "$base_a" "$tmp/moved_a"
train --set lora.r=4 --set model.from="$tmp/moved_a" --resume "$tmp/run/step_00000001" --set train.checkpoint_dir="$tmp/moved" \
  --steps 2 >/dev/null 2>"$tmp/moved.err" && ok "the same base at another path resumes" \
  || bad "the same base at another path: $(cat "$tmp/moved.err")"

# A checkpoint from before the record: resumes, with a warning that its base is not checked.
cp -r "$tmp/run/step_00000001" "$tmp/old_step"
$py - "$tmp/old_step/meta.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); del m["lora_base"]; json.dump(m, open(sys.argv[1], "w"))
PY
"$bin" --config "$tmp/cfg.json" --set lora.r=4 --resume "$tmp/old_step" --set train.checkpoint_dir="$tmp/old" --steps 2 \
  >/dev/null 2>"$tmp/old.err" && grep -q "records no base" "$tmp/old.err" \
  && ok "a checkpoint without the record resumes with a warning" || bad "an old checkpoint: $(cat "$tmp/old.err")"

# A run on a random (seeded) base resumes as before; a model.from is refused.
"$bin" --config "$tmp/cfg.json" --quiet --set lora.r=4 --steps 1 --set train.checkpoint_dir="$tmp/rand" >/dev/null 2>&1 &&
  "$bin" --config "$tmp/cfg.json" --quiet --set lora.r=4 --resume "$tmp/rand" --set train.checkpoint_dir="$tmp/rand" \
    >/dev/null 2>"$tmp/rand.err" &&
  [ -d "$tmp/rand/step_00000002" ] && ok "a LoRA run on a random base resumes" || bad "random base: $(cat "$tmp/rand.err")"
refused "trained on a randomly initialised base .*resume without model.from" \
  "$bin" --config "$tmp/cfg.json" --set lora.r=4 --set model.from="$base_a" --resume "$tmp/rand/step_00000001" \
  --set train.checkpoint_dir="$tmp/rand2"

# lora.from: an unknown adapter_config.json key is a warning naming it; lora_bias is refused by name.
adapter=$tmp/run/step_00000001
cp -r "$adapter" "$tmp/typo" && $py - "$tmp/typo/adapter_config.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); a["lora_alpah"] = 16; json.dump(a, open(sys.argv[1], "w"))
PY
"$bin" --config "$tmp/cfg.json" --set model.from="$base_a" --set lora.from="$tmp/typo" --steps 1 >/dev/null 2>"$tmp/typo.err" &&
  grep -q "adapter_config.json: unknown keys lora_alpah" "$tmp/typo.err" && ok "an unknown adapter key is a warning" \
  || bad "an unknown adapter key: $(cat "$tmp/typo.err")"
cp -r "$adapter" "$tmp/biased" && $py - "$tmp/biased/adapter_config.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); a["lora_bias"] = True; json.dump(a, open(sys.argv[1], "w"))
PY
refused "adapter_config.json: lora_bias true: lora_B has a bias" \
  "$bin" --config "$tmp/cfg.json" --set model.from="$base_a" --set lora.from="$tmp/biased" --steps 1

exit $fail
