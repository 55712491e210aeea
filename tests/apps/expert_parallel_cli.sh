#!/usr/bin/env bash
# moe.expert_parallel_size through autosp-graph: the rank's program holds moe_experts_ep over its
# own experts, --plan-memory's parameter bytes lose exactly (E - 1) / E of the experts' bytes, and
# with ZeRO 1 and 3 the dense state is sharded over the world and the experts' over the world / E
# ranks holding them (decision 185), and bad values (E < 1, not an integer, not dividing the experts
# or the ranks, on a dense model) give one `error:` line naming the key and exit code 2.
#   expert_parallel_cli.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-graph
src=$2
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib/refusals.sh"

# A tiny Mixtral: 2 layers of 4 experts, [24, 32] gates and ups, [32, 24] downs.
cat >"$tmp/moe.json" <<'JSON'
{"model": {"arch": "mixtral", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24,
           "num_local_experts": 4, "num_experts_per_tok": 2},
 "data": {"seq_len": 16, "batch_size": 1}}
JSON
moe=(--config "$tmp/moe.json" --world 4 --set sequence_parallel.autosp_size=4)

# On CUDA too (decision 225): the same rank program, its MoE nodes moe_experts_ep.
out=$("$bin" "${moe[@]}" --rank 1 --set moe.expert_parallel_size=2 --set runtime.device=cuda --stage autosp 2>"$tmp/err")
if [ $? -ne 0 ]; then echo "FAIL: autosp-graph with moe.expert_parallel_size=2 on cuda: $(cat "$tmp/err")"; fail=1
elif [ "$(grep -c "moe_experts_ep(" <<<"$out")" -ne 2 ] || grep -q "moe_experts(" <<<"$out"; then
  echo "FAIL: the CUDA EP program's two MoE nodes are not moe_experts_ep"; fail=1
fi

out=$("$bin" "${moe[@]}" --rank 3 --set moe.expert_parallel_size=2 --stage autosp 2>"$tmp/err")
if [ $? -ne 0 ]; then echo "FAIL: autosp-graph with moe.expert_parallel_size=2: $(cat "$tmp/err")"; fail=1
elif ! grep -q "moe_experts_ep(" <<<"$out" || grep -q "moe_experts(" <<<"$out"; then
  echo "FAIL: the EP program's MoE nodes are not moe_experts_ep"; fail=1
elif ! grep -q "experts.3.w1.weight" <<<"$out" || grep -q "experts.1.w1.weight" <<<"$out"; then
  echo "FAIL: ep rank 1 of 2 should hold experts 2 and 3 only"; fail=1
else echo "ok: ep rank 1 of 2 holds experts 2, 3 as moe_experts_ep"; fi

for E in 1 2 4; do
  "$bin" "${moe[@]}" --rank 0 --set moe.expert_parallel_size=$E --plan-memory S=16,B=1 >"$tmp/plan$E.json" 2>"$tmp/err" \
    || { echo "FAIL: --plan-memory at E = $E: $(cat "$tmp/err")"; fail=1; }
done
python3 - "$tmp" <<'PY' || fail=1
import json, sys
p = {E: json.load(open(f"{sys.argv[1]}/plan{E}.json"))["parameter_bytes"] for E in (1, 2, 4)}
experts = 2 * 4 * 3 * 24 * 32 * 4  # layers x experts x (gate, up, down) x I x C x f32 bytes
ok = p[1] - p[2] == experts // 2 and p[1] - p[4] == 3 * experts // 4
print(("ok" if ok else "FAIL") + f": parameter bytes at E = 1, 2, 4: {p[1]}, {p[2]}, {p[4]} (experts {experts})")
sys.exit(0 if ok else 1)
PY

for z in 1 3; do
  "$bin" "${moe[@]}" --rank 0 --set moe.expert_parallel_size=2 --set zero_optimization.stage=$z \
    --plan-memory S=16,B=1 >"$tmp/zero$z.json" 2>"$tmp/err" \
    || { echo "FAIL: --plan-memory at E = 2, ZeRO $z: $(cat "$tmp/err")"; fail=1; }
done
python3 - "$tmp" <<'PY' || fail=1
import json, sys
z = {s: json.load(open(f"{sys.argv[1]}/zero{s}.json")) for s in (1, 3)}
experts = 2 * 2 * 3 * 24 * 32 * 4  # this rank's 2 of 4 experts in 2 layers, f32
dense = z[1]["parameter_bytes"] - experts
shard = dense // 4 + experts // 2  # the dense over the 4 ranks, the experts over their 2 replicas
ok = z[1]["optimizer_bytes"] == 2 * shard and z[3]["parameter_bytes"] == shard and z[3]["optimizer_bytes"] == 2 * shard
print(("ok" if ok else "FAIL") + f": E = 2 x ZeRO 1, 3 on 4 ranks: {shard} bytes of parameter shards, "
      f"optimizer {z[1]['optimizer_bytes']}, {z[3]['optimizer_bytes']}; ZeRO-3 parameters {z[3]['parameter_bytes']}")
sys.exit(0 if ok else 1)
PY

ep() { refused_alone "$1" "$bin" "${moe[@]}" --rank 0 "${@:2}"; }
ep "moe.expert_parallel_size" --set moe.expert_parallel_size=0
ep "moe.expert_parallel_size" --set moe.expert_parallel_size=-2
ep "moe.expert_parallel_size" --set moe.expert_parallel_size=x
ep "moe.expert_parallel_size 3 does not divide model.num_local_experts 4" --set moe.expert_parallel_size=3
ep "moe.expert_parallel_size 8 does not divide" --set moe.expert_parallel_size=8
refused_alone "moe.expert_parallel_size 2 does not divide the world size 3" "$bin" --config "$tmp/moe.json" \
  --world 3 --rank 0 --set moe.expert_parallel_size=2
# With ZeRO 3 too (the experts' shards live on world / E ranks): the same refusal, before any sharding.
refused_alone "moe.expert_parallel_size 4 does not divide the world size 6" "$bin" --config "$tmp/moe.json" \
  --world 6 --rank 0 --set moe.expert_parallel_size=4 --set zero_optimization.stage=3
refused_alone "moe.expert_parallel_size 2 needs a mixture of experts" "$bin" --config "$src/configs/llama-tiny.json" \
  --world 2 --rank 0 --set moe.expert_parallel_size=2

if [ $fail -eq 0 ]; then echo "expert_parallel_cli: all checks passed"; fi
exit $fail
