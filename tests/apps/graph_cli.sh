#!/usr/bin/env bash
# autosp-graph: prints both architectures' forward graphs; bad flags and configs give one
# `error:` line and exit code 2.
#   graph_cli.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-graph
src=$2
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect_ok() {  # expect_ok NEEDLE ARGS...
  local needle=$1
  shift
  if ! out=$("$bin" "$@" 2>"$tmp/err"); then
    echo "FAIL: autosp-graph $* exited non-zero: $(cat "$tmp/err")"
    fail=1
  elif ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAIL: autosp-graph $* did not print '$needle'"
    fail=1
  fi
}

expect_lacks() {  # expect_lacks NEEDLE ARGS...: runs, and the output does not hold NEEDLE
  local needle=$1
  shift
  if ! out=$("$bin" "$@" 2>"$tmp/err"); then
    echo "FAIL: autosp-graph $* exited non-zero: $(cat "$tmp/err")"
    fail=1
  elif grep -qF -- "$needle" <<<"$out"; then
    echo "FAIL: autosp-graph $* printed '$needle'"
    fail=1
  fi
}

. "$(dirname "$0")/lib/refusals.sh"
expect_usage_error() { refused_alone "$1" "$bin" "${@:2}"; }  # expect_usage_error NEEDLE ARGS...

expect_ok "sdpa(%l0.q_rope, %l0.k_rope, %l0.v, causal=true" --config "$src/configs/llama-tiny.json"
expect_ok "f32[B, 4, S, 16]" --config "$src/configs/llama-tiny.json" --world 2 --rank 1
expect_ok "layernorm(%x, %transformer.h.0.ln_1.weight" --config "$src/configs/gpt2-tiny.json" --stage forward
expect_ok '"op": "sdpa"' --config "$src/configs/gpt2-tiny.json" --format json
expect_ok "digraph autosp" --config "$src/configs/gpt2-tiny.json" --format dot
expect_ok "--config" --help
# --stage stops after any pass of the program: the slices exist after shard_input_ids, the
# all-to-alls only after insert_attention_all_to_all, the gradients after autograd.
llama=(--config "$src/configs/llama-tiny.json" --set sequence_parallel.autosp_size=2 --world 2 --rank 1)
expect_ok "slice(%input_ids" "${llama[@]}" --stage shard_input_ids
expect_lacks "all_to_all" "${llama[@]}" --stage shard_input_ids
expect_ok "all_to_all" "${llama[@]}" --stage insert_attention_all_to_all
expect_lacks "role=gradient" "${llama[@]}" --stage fuse_elementwise
expect_ok "role=gradient" "${llama[@]}" --stage autograd
expect_ok "cast(" --config "$src/configs/gpt2-tiny.json" --set runtime.dtype=bfloat16 --stage mixed_precision
# Packed documents: the doc_start input, its slice, and the one all-to-all that gathers it for attention.
docs=("${llama[@]}" --set data.source=tokens --set data.path=x.bin --set data.eos_token_id=2 --set data.document_mask=true)
expect_ok "role=doc_start" "${docs[@]}" --stage forward
expect_ok "slice(%doc_start" "${docs[@]}" --stage shard_doc_start
expect_ok "all_to_all(%doc_start.r.rep" "${docs[@]}" --stage insert_attention_all_to_all
expect_ok "%doc_start.r.full, causal=true" "${docs[@]}" --stage autosp

echo '{"model": {"arch": "gpt3"}}' >"$tmp/bad-arch.json"
echo '{"model": ' >"$tmp/truncated.json"
echo '{"model": {"hidden_size": 4}, "extra": 1}' >"$tmp/unknown.json"
head -c 300 /dev/urandom >"$tmp/random.json"
expect_usage_error "config is required"
expect_usage_error "gpt3" --config "$tmp/bad-arch.json"
expect_usage_error "not valid JSON" --config "$tmp/truncated.json"
expect_usage_error "unknown key 'extra'" --config "$tmp/unknown.json"
expect_usage_error "random.json" --config "$tmp/random.json"
expect_usage_error "cannot open" --config "$tmp/nope.json"
# A config through a pipe (bash's <(...)) is read; a FIFO nothing writes to is refused after the
# wait (AUTOSP_PIPE_TIMEOUT), not waited on for ever; a device is not a config file.
expect_ok "sdpa(%l0.q_rope" --config <(cat "$src/configs/llama-tiny.json")
expect_ok "sdpa(%l0.q_rope" --config <(sleep 1; cat "$src/configs/llama-tiny.json")
mkfifo "$tmp/fifo"
refused_alone "fifo: a FIFO that nothing wrote to in 1 s: no process writes to it" \
  env AUTOSP_PIPE_TIMEOUT=1 "$bin" --config "$tmp/fifo"
expect_usage_error "/dev/null: not a regular file (a character device); expected a config file" --config /dev/null
expect_usage_error "--rank" --config "$src/configs/gpt2-tiny.json" --world 2 --rank 2
expect_usage_error "--world" --config "$src/configs/gpt2-tiny.json" --world 0
expect_usage_error "--format" --config "$src/configs/gpt2-tiny.json" --format yaml
expect_usage_error "--stage" --config "$src/configs/gpt2-tiny.json" --stage sideways
# One rank runs no AutoSP pass: the error lists the passes it does run.
expect_usage_error "a pass this program runs (fuse_elementwise, autograd, concat_slice_grads, canonicalize)" \
  --config "$src/configs/gpt2-tiny.json" --stage shard_seq_dim
expect_usage_error "world" --config "$src/configs/gpt2-tiny.json" --world two
expect_usage_error "bogus" --config "$src/configs/gpt2-tiny.json" --bogus
expect_usage_error "model.hidden_size" --config "$src/configs/gpt2-tiny.json" --set model.hidden_size=abc
# A plan past the model's positions (issue 47): GPT-2's learned table ends at 1024 rows, so S=131072
# is refused naming both; Llama's RoPE takes it, with a warning past max_position_embeddings (65536)
# and without rope_scaling, and none within it or with scaling.
expect_usage_error "--plan-memory S=131072 exceeds model.max_position_embeddings 1024 (gpt2's positions are a learned table" \
  --config "$src/configs/gpt2-tiny.json" --plan-memory S=131072
expect_usage_error "--plan-memory S 'lots': expected an integer" --config "$src/configs/gpt2-tiny.json" --plan-memory S=lots
"$bin" --config "$src/configs/llama-tiny.json" --set model.num_hidden_layers=1 --plan-memory S=131072 >"$tmp/plan_long.json" \
  2>"$tmp/err" || { echo "FAIL: --plan-memory S=131072 on llama-tiny: $(cat "$tmp/err")"; fail=1; }
grep -q 'warning.*--plan-memory S=131072 exceeds model.max_position_embeddings 65536 and the model has no rope_scaling' \
  "$tmp/err" || { echo "FAIL: no warning past RoPE's positions: $(cat "$tmp/err")"; fail=1; }
grep -q '"S":131072' "$tmp/plan_long.json" || { echo "FAIL: no plan at S=131072"; fail=1; }
"$bin" --config "$src/configs/llama-tiny.json" --set model.num_hidden_layers=1 --plan-memory S=65536 >/dev/null 2>"$tmp/err"
[ ! -s "$tmp/err" ] || { echo "FAIL: a warning within the positions: $(cat "$tmp/err")"; fail=1; }
"$bin" --config "$src/configs/llama-tiny.json" --set model.num_hidden_layers=1 --plan-memory S=131072 \
  --set 'model.rope_scaling={"rope_type":"linear","factor":4}' >/dev/null 2>"$tmp/err"
[ ! -s "$tmp/err" ] || { echo "FAIL: a warning with rope_scaling: $(cat "$tmp/err")"; fail=1; }

# --plan-memory without --stage plans the training program (the joint graph), not the forward.
"$bin" --config "$src/configs/gpt2-tiny.json" --plan-memory S=64 >"$tmp/plan_default.json" 2>"$tmp/err" &&
  "$bin" --config "$src/configs/gpt2-tiny.json" --stage joint --plan-memory S=64 >"$tmp/plan_joint.json" &&
  "$bin" --config "$src/configs/gpt2-tiny.json" --stage forward --plan-memory S=64 >"$tmp/plan_forward.json" ||
  { echo "FAIL: --plan-memory default: $(cat "$tmp/err")"; fail=1; }
cmp -s "$tmp/plan_default.json" "$tmp/plan_joint.json" || { echo "FAIL: --plan-memory's default is not the joint plan"; fail=1; }
cmp -s "$tmp/plan_default.json" "$tmp/plan_forward.json" && { echo "FAIL: --plan-memory's default is the forward plan"; fail=1; }

# --plan-memory at each zero_optimization.stage, world 4 (dp 4): the moments are 2 x the
# parameters at stage 0 and a quarter of that at 1 and 2; the gradient buckets are a whole copy of
# the gradients at 0 (plus the quarter they reduce-scatter into at 1), only the quarter at 2, where
# the gradient outputs are no longer kept. At 3 the parameters, gradient outputs and moments are
# quarters (ceil per parameter), with no buckets.
for stage in 0 1 2 3; do
  "$bin" --config "$src/configs/gpt2-tiny.json" --world 4 --rank 0 --stage joint --plan-memory S=64 \
    --set zero_optimization.stage=$stage >"$tmp/plan$stage.json" 2>"$tmp/err" ||
    { echo "FAIL: --plan-memory at stage $stage: $(cat "$tmp/err")"; fail=1; }
done
python3 - "$tmp" <<'PY' || fail=1
import json, sys
p = [json.load(open(f"{sys.argv[1]}/plan{s}.json")) for s in range(4)]
params = p[0]["parameter_bytes"]
# gpt2-tiny's parameters: every size divisible by 4, so the shards are exact quarters.
checks = [
    (p[0]["optimizer_bytes"] == 2 * params, "stage 0 moments"),
    (p[1]["optimizer_bytes"] == (2 * params + 3) // 4, "stage 1 moments"),
    (p[2]["optimizer_bytes"] == p[1]["optimizer_bytes"], "stage 2 moments"),
    (p[0]["grad_bucket_bytes"] == params, "stage 0 buckets"),
    (p[1]["grad_bucket_bytes"] == params + (params + 3) // 4, "stage 1 buckets and shard"),
    (p[2]["grad_bucket_bytes"] == (params + 3) // 4, "stage 2 bucket shard"),
    (p[2]["output_bytes"] == p[1]["output_bytes"] - params, "stage 2 gradient outputs"),
    (p[3]["parameter_bytes"] == params // 4, "stage 3 parameter shards"),
    (p[3]["optimizer_bytes"] == 2 * params // 4, "stage 3 moments"),
    (p[3]["grad_bucket_bytes"] == 0, "stage 3 has no buckets"),
    (p[3]["output_bytes"] == p[1]["output_bytes"] - params + params // 4, "stage 3 gradient shards"),
    (p[0]["total_bytes"] > p[1]["total_bytes"] > p[2]["total_bytes"] > p[3]["total_bytes"], "totals fall with the stage"),
]
bad = [what for ok, what in checks if not ok]
if bad:
    print("FAIL: --plan-memory zero stages:", ", ".join(bad), [{k: q[k] for k in q if k != "bindings"} for q in p])
    sys.exit(1)
PY

# LoRA (r 4 on all four projections of gpt2-tiny: 16,384 adapter elements a layer, 4 layers, f32):
# the base is frozen, counted apart, with no moments, gradient buckets or gradient outputs; only the
# adapters have them. At stage 3 the frozen base is sharded like the parameters (a quarter).
for stage in 0 3; do
  "$bin" --config "$src/configs/gpt2-tiny.json" --world 4 --rank 0 --plan-memory S=64 --set zero_optimization.stage=$stage \
    --set lora.r=4 --set lora.target_modules=all-linear >"$tmp/lora$stage.json" 2>"$tmp/err" ||
    { echo "FAIL: --plan-memory with lora at stage $stage: $(cat "$tmp/err")"; fail=1; }
done
python3 - "$tmp" <<'PY' || fail=1
import json, sys
full = json.load(open(f"{sys.argv[1]}/plan0.json"))
l0, l3 = (json.load(open(f"{sys.argv[1]}/lora{s}.json")) for s in (0, 3))
params, adapters = full["parameter_bytes"], 4 * 16384 * 4
checks = [
    (l0["frozen_parameter_bytes"] == params, "stage 0: the whole base is frozen"),
    (l0["parameter_bytes"] == params + adapters, "stage 0: base + adapters"),
    (l0["optimizer_bytes"] == 2 * adapters, "stage 0: moments of the adapters only"),
    (l0["grad_bucket_bytes"] == adapters, "stage 0: buckets of the adapters' gradients only"),
    (l3["frozen_parameter_bytes"] == params // 4, "stage 3: a quarter of the base"),
    (l3["optimizer_bytes"] == 2 * adapters // 4, "stage 3: moments of the adapters' shards"),
    (l0["total_bytes"] < full["total_bytes"], "LoRA plans less than full training"),
]
bad = [what for ok, what in checks if not ok]
if bad:
    print("FAIL: --plan-memory with lora:", ", ".join(bad), [{k: q[k] for k in q if k not in ("bindings", "peak")} for q in (l0, l3)])
    sys.exit(1)
PY

if [ $fail -eq 0 ]; then echo "graph_cli: all checks passed"; fi
exit $fail
