#!/usr/bin/env bash
# Issue 41's bad inputs through autosp-train itself (the library-level checks are in
# tests/models/test_moe.cpp): num_experts_per_tok above the experts; moe.expert_parallel_size not
# dividing the experts or the world (thread ranks); a model.from directory (a checkpoint of the tiny
# Mixtral, an HF directory) whose weights lack an expert's tensor or hold one misshaped, each an
# `error:` line naming the key or the tensor and exit 2; output_router_logits with a zero
# router_aux_loss_coef trains and says in the log that the aux loss adds nothing.
#   moe_bad_inputs.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-train
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib/refusals.sh"
. "$(dirname "$0")/lib/tiny_mixtral.sh"

tiny_mixtral "$tmp/moe.json"
c=(--config "$tmp/moe.json")

refused_alone "model.num_experts_per_tok 5 exceeds model.num_local_experts 4" "$bin" "${c[@]}" --set model.num_experts_per_tok=5
refused_alone "moe.expert_parallel_size 3 does not divide model.num_local_experts 4" "$bin" "${c[@]}" \
  --set moe.expert_parallel_size=3
refused "moe.expert_parallel_size 4 does not divide the world size 2" "$bin" "${c[@]}" --thread-ranks 2 \
  --set moe.expert_parallel_size=4

# An HF directory of the model: the checkpoint of one step.
"$bin" "${c[@]}" --set train.checkpoint_dir="$tmp/ck" --set train.checkpoint_every=1 >"$tmp/out" 2>&1 \
  || { echo "FAIL: the one-step run that writes the directory: $(tail -3 "$tmp/out")"; fail=1; }
dir=$tmp/ck/step_00000001
# Its model.safetensors with one expert tensor's entry dropped (missing) or its shape transposed (the
# same bytes, the wrong shape): the safetensors header is JSON after an 8-byte length.
doctor() {
  python3 - "$dir/model.safetensors" "$1" "$2" <<'PY'
import json, struct, sys
path, out, how = sys.argv[1:]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
name = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
if how == "missing":  # its bytes stay, referenced by no entry
    head.pop(name)
else:
    head[name]["shape"] = head[name]["shape"][::-1]
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(out, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
}
for how in missing misshaped; do
  mkdir -p "$tmp/$how"
  cp "$dir/config.json" "$tmp/$how/"
  doctor "$tmp/$how/model.safetensors" $how || fail=1
done
refused "missing tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight'" "$bin" "${c[@]}" \
  --set model.from="$tmp/missing"
refused "tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight' has shape \[24, 32\], the model expects \[32, 24\]" \
  "$bin" "${c[@]}" --set model.from="$tmp/misshaped"

# A zero coefficient: it trains on the LM loss and the log says the aux loss adds nothing.
"$bin" "${c[@]}" --set model.output_router_logits=true --set model.router_aux_loss_coef=0 >"$tmp/out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then echo "FAIL: output_router_logits with coefficient 0 exited $rc: $(tail -3 "$tmp/out")"; fail=1
elif ! grep -q "router_aux_loss_coef 0: the load-balancing loss is computed and logged.*adds nothing" "$tmp/out"; then
  echo "FAIL: no log line says the zero-coefficient aux loss adds nothing"; fail=1
else echo "ok: output_router_logits with coefficient 0 trains, and the log says so"; fi

if [ $fail -eq 0 ]; then echo "moe_bad_inputs: all checks passed"; fi
exit $fail
