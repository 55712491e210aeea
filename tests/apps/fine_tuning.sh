#!/usr/bin/env bash
# docs/fine-tuning.md end to end, at tiny size: the same commands on a chat model directory made
# offline (tests/ref/chat_fixture.py: a 2-layer Llama with a ChatML template) instead of a real one
# (the page's py=$(bash scripts/hf-venv.sh) is "$py" here, its models/Qwen2.5-0.5B-Instruct "model").
#   1. conversations JSONL -> prepare_data.py --chat with the model directory's tokenizer;
#   2. -> autosp-train with model.from and the loss masks on 2 ranks (AutoSP, P = 2): the loss falls,
#      the step lines carry the target count;
#   3. -> autosp-sample answering in the chat format: the prompt rendered by chat_prompt.py with the
#      model's template, the answer a non-empty assistant turn closed by <|im_end|> (the turn end
#      chat_prompt.py --turn-end names): one word to "what is the next word after alpha" (here
#      "beta"), two to "say mu twice please".
# Then a run whose masks remove every target: each step skipped with its log line, and the warning
# that the masks remove nearly everything. Needs the venv of scripts/hf-venv.sh and mpirun; exit 77
# (skipped) without the venv.
#   fine_tuning.sh BIN_DIR SOURCE_DIR
set -u
bin=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
py=$(bash "$src/scripts/hf-venv.sh" --check 2>/dev/null) || { echo "skip: no $src/.venv-hf (scripts/hf-venv.sh)"; exit 77; }
tmp=$(mktemp -d)
trap "rm -rf $tmp" EXIT
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
rows=0
check() {
  rows=$((rows + 1))
  if [ "$1" -ne 0 ]; then echo "FAIL [$rows] $2"; fail=1; else echo "ok   [$rows] $2"; fi
}
cd "$tmp" || exit 1
"$py" "$src/tests/ref/chat_fixture.py" model --model --conversations conversations.jsonl 200
check $? "a tiny chat model directory and 200 conversations"

# 1. (docs/fine-tuning.md step 1)
"$py" "$src/scripts/prepare_data.py" --chat --tokenizer model --seq-len 64 --val-fraction 0.05 --out data \
  conversations.jsonl >prep.out 2>&1 && grep -q '"document_mask": true' data/data.json
check $? "prepare_data.py --chat: $(tail -c 160 prep.out)"

# 2. (step 2: the doc's sft.json, at tiny size)
cat >sft.json <<'JSON'
{"model": {"from": "model"},
 "data": {"source": "tokens", "path": "data/train_*.bin", "loss_mask_path": "data/train_*.npy",
          "doc_ids_path": "data/docs_train_*.npy",
          "val_path": "data/val_*.bin", "val_loss_mask_path": "data/val_*.npy",
          "val_doc_ids_path": "data/docs_val_*.npy",
          "seq_len": 64, "batch_size": 8, "eos_token_id": 0, "document_mask": true, "shuffle": true},
 "train": {"steps": 200, "lr": 2e-2, "min_lr": 2e-3, "warmup_steps": 10, "log_every": 50,
           "eval_every": 200, "eval_batches": 1, "checkpoint_dir": "runs/chat"},
 "sequence_parallel": {"autosp_size": 2}}
JSON
mpirun --oversubscribe -np 2 "$bin/autosp-train" --config sft.json --metrics m.jsonl >train.out 2>&1 &&
  "$py" - <<'PY'
import json
m = [json.loads(l) for l in open("m.jsonl")]
assert m[-1]["step"] == 200 and m[-1]["loss"] < m[0]["loss"] - 3, (m[0]["loss"], m[-1]["loss"])
assert all(0 < r["targets"] < r["tokens"] for r in m), "targets per step, fewer than the input tokens"
PY
check $? "autosp-train on 2 ranks with model.from and the masks: $(grep -m1 'done:' train.out | cut -c40-)"
grep -q '| targets [0-9]* |' train.out
check $? "the step line carries the target count: $(grep -m1 'step 50/' train.out | cut -c40-160)"

# 3. (step 3)
end=$("$py" "$src/scripts/chat_prompt.py" model --turn-end)
ask() {
  ids=$("$py" "$src/scripts/chat_prompt.py" model --ids --system "you are a helpful assistant" "$1")
  "$bin/autosp-sample" --checkpoint runs/chat --tokenizer data/tokenizer.json --prompt-ids "$ids" \
    --eos-token-id "$end" --max-new-tokens 12 2>&1 | grep '^text: '
}
# A one-word turn closed by <|im_end|> (the right word, "beta", here; a different machine's rounding
# may train a tiny model to another word, so the format is what is checked).
answer=$(ask "what is the next word after alpha")
[[ $answer =~ ^text:\ [a-z]+\<\|im_end\|\>$ ]]
check $? "autosp-sample answers in the chat format: '$answer'"
answer=$(ask "say mu twice please")
[[ $answer =~ ^text:\ [a-z]+\ [a-z]+\<\|im_end\|\>$ ]]
check $? "a second question, a two-word turn closed by <|im_end|>: '$answer'"

# Every target masked: skipped steps, each with its line, and the warning.
"$py" - <<'PY'
import glob
import numpy as np
for p in glob.glob("data/train_*.npy"):
    np.save(p, np.zeros_like(np.load(p)))
PY
mpirun --oversubscribe -np 2 "$bin/autosp-train" --config sft.json --set train.steps=2 --set train.eval_every=0 \
  --set train.checkpoint_dir= --set data.val_path= --set data.val_loss_mask_path= --set data.val_doc_ids_path= >masked.out 2>&1 &&
  [ "$(grep -c 'no position of the batch is scored.*skipped without an update' masked.out)" -eq 2 ] &&
  grep -q 'only 0 of 512 input tokens (0.000%) after step 1 are targets: the loss masks and document mask remove nearly everything' masked.out
check $? "all masked: every step skipped with a log line, and the few-targets warning"

echo "$rows rows"
exit $fail
