#!/usr/bin/env bash
# Expert parallelism in the layout search (decision 217): autosp-plan lists a tiny Mixtral's layouts
# with E = 1, 2 and 4 on 4 ranks (each with its --set moe.expert_parallel_size line and its exchange
# cost) and a dense Llama's with E = 1 only; autosp-train with moe.expert_parallel_size "auto" on 2
# thread ranks resolves it, says so in the log and trains; a value that is neither an integer nor
# "auto" is one `error:` line naming the key, exit 2.
#   plan_expert_parallel.sh BIN_DIR SOURCE_DIR
set -u
bin=$1
src=$2
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib/refusals.sh"
. "$(dirname "$0")/lib/tiny_mixtral.sh"

tiny_mixtral "$tmp/moe.json"

plan() { "$bin/autosp-plan" --ranks 4 --seq-len 16 --device cpu --memory 1GiB --top 40 --format json "$@"; }
plan --config "$tmp/moe.json" >"$tmp/moe_plan.json" 2>"$tmp/err" || { echo "FAIL: autosp-plan (Mixtral): $(cat "$tmp/err")"; fail=1; }
plan --config "$src/configs/llama-tiny.json" >"$tmp/dense_plan.json" 2>"$tmp/err" \
  || { echo "FAIL: autosp-plan (Llama): $(cat "$tmp/err")"; fail=1; }
python3 - "$tmp" <<'PY' || fail=1
import json, sys
moe = json.load(open(f"{sys.argv[1]}/moe_plan.json"))["best"]
dense = json.load(open(f"{sys.argv[1]}/dense_plan.json"))["best"]
eps = sorted({c["expert_parallel_size"] for c in moe})
sets = all(f"moe.expert_parallel_size={c['expert_parallel_size']}" in c["set"] for c in moe)
cost = all((c["expert_s"] > 0) == (c["expert_parallel_size"] > 1) for c in moe)
ok = eps == [1, 2, 4] and sets and cost and dense and all(c["expert_parallel_size"] == 1 for c in dense)
print(("ok" if ok else "FAIL") + f": autosp-plan lists E = {eps} for the Mixtral (set lines {sets}, exchange cost "
      f"{cost}), E = {sorted({c['expert_parallel_size'] for c in dense})} for the Llama")
sys.exit(0 if ok else 1)
PY

"$bin/autosp-train" --config "$tmp/moe.json" --thread-ranks 2 --steps 2 --set moe.expert_parallel_size=auto \
  --metrics "$tmp/m.jsonl" >"$tmp/out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then echo "FAIL: autosp-train with moe.expert_parallel_size auto exited $rc: $(tail -3 "$tmp/out")"; fail=1
elif ! grep -q '"auto" resolved for 2 ranks.*moe.expert_parallel_size=[12]' "$tmp/out"; then
  echo "FAIL: no log line says which moe.expert_parallel_size \"auto\" chose"; fail=1
elif [ "$(wc -l <"$tmp/m.jsonl")" -ne 2 ]; then echo "FAIL: expected 2 steps in the metrics"; fail=1
else echo "ok: autosp-train resolved moe.expert_parallel_size auto on 2 ranks ($(grep -o 'moe.expert_parallel_size=[0-9]*' "$tmp/out" | head -1)) and trained"; fi

refused_alone "moe.expert_parallel_size" "$bin/autosp-train" --config "$tmp/moe.json" --set moe.expert_parallel_size=automatic
refused_alone "moe.expert_parallel_size" "$bin/autosp-plan" --config "$tmp/moe.json" --ranks 4 --seq-len 16 --device cpu \
  --set moe.expert_parallel_size=1.5

if [ $fail -eq 0 ]; then echo "plan_expert_parallel: all checks passed"; fi
exit $fail
