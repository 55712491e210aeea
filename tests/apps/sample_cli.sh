#!/usr/bin/env bash
# autosp-sample through the real binary: a checkpoint written by autosp-train samples greedily
# (twice the same), with and without the KV cache alike, from ids and (a model of data.source
# text) from text; then one row per malformed input: each must exit 2 within 20 s with an `error:`
# line containing the row's text. Greedy tokens against transformers: tests/ref/hf_generate.py.
#   sample_cli.sh BIN_DIR SOURCE_DIR
set -u
train=$1/autosp-train
sample=$1/autosp-sample
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
fail=0
rows=0

cat >"$tmp/cfg.json" <<'JSON'
{"model": {"arch": "llama", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
 "data": {"source": "text", "seq_len": 16, "batch_size": 2},
 "train": {"steps": 3, "log_every": 1},
 "runtime": {"threads": 1}}
JSON
printf 'the quick brown fox jumps over the lazy dog. %.0s' {1..20} >"$tmp/text.txt"
"$train" --config "$tmp/cfg.json" --set "data.path=$tmp/text.txt" --set "train.checkpoint_dir=$tmp/ck" --quiet 2>"$tmp/train.log" ||
  { echo "FAIL: could not train the model to sample from: $(tail -3 "$tmp/train.log")"; exit 1; }

# A GPT-2 (learned positions, 32 of them) for the position-table rows.
cat >"$tmp/gpt2.json" <<'JSON'
{"model": {"arch": "gpt2", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "max_position_embeddings": 32},
 "data": {"source": "text", "seq_len": 16, "batch_size": 2},
 "train": {"steps": 3, "log_every": 1},
 "runtime": {"threads": 1}}
JSON
"$train" --config "$tmp/gpt2.json" --set "data.path=$tmp/text.txt" --set "train.checkpoint_dir=$tmp/gck" --quiet 2>"$tmp/train.log" ||
  { echo "FAIL: could not train the GPT-2 to sample from: $(tail -3 "$tmp/train.log")"; exit 1; }
gck=(--checkpoint "$tmp/gck")

check() {  # check NAME CONDITION-EXIT-CODE
  rows=$((rows + 1))
  if [ "$2" -ne 0 ]; then echo "FAIL [$rows] $1"; fail=1; else echo "ok   [$rows] $1"; fi
}
a=$("$sample" --checkpoint "$tmp/ck" --prompt-ids 116,104,101 --max-new-tokens 8 2>&1)
b=$("$sample" --checkpoint "$tmp/ck/step_00000003" --prompt-ids 116,104,101 --max-new-tokens 8 --no-kv-cache 2>&1)
echo "$a" | sed 's/^/    /'
[ "$a" = "$b" ] && echo "$a" | grep -q '^ids: [0-9]*\(,[0-9]*\)\{7\}$'
check "greedy from the newest checkpoint, KV cache = full recompute" $?
t=$("$sample" --checkpoint "$tmp/ck" --prompt 'the quick' --max-new-tokens 5 --json 2>&1)
echo "$t" | sed 's/^/    /'
echo "$t" | grep -q '"prompt_ids":\[116,104,101,32,113,117,105,99,107\]' && echo "$t" | grep -q '"text":'
check "a text prompt of a data.source text model goes through its bytes" $?
s1=$("$sample" --checkpoint "$tmp/ck" --prompt-ids 1 --temperature 1.0 --top-k 5 --seed 3 --max-new-tokens 12 2>&1)
s2=$("$sample" --checkpoint "$tmp/ck" --prompt-ids 1 --temperature 1.0 --top-k 5 --seed 3 --max-new-tokens 12 2>&1)
[ "$s1" = "$s2" ]
check "seeded sampling repeats" $?
# Generation runs on the CPU: runtime.device "cuda" is said to be unused, and the tokens are the CPU's.
d0=$("$sample" --checkpoint "$tmp/ck" --prompt-ids 116,104,101 --max-new-tokens 8 2>/dev/null)
d=$("$sample" --checkpoint "$tmp/ck" --prompt-ids 116,104,101 --max-new-tokens 8 --set runtime.device=cuda 2>"$tmp/dev.err")
[ "$d" = "$d0" ] &&
  grep -q 'warning.*runtime.device "cuda" (--set) is not used: autosp-sample generates on the CPU only' "$tmp/dev.err"
check "runtime.device cuda: a warning that generation runs on the CPU" $?
# A tiny temperature is greedy: 3e-308 once overflowed logits/T to inf − inf = NaN and picked token
# 0 every time; subnormals (1e-310, 4.9e-324) were refused as "expected a number" (stod's ERANGE).
g=$("$sample" --checkpoint "$tmp/ck" --prompt-ids 116,104,101 --max-new-tokens 8 2>&1)
for t in 3e-308 2.3e-308 1e-310 4.9e-324 1e-400; do
  s=$("$sample" --checkpoint "$tmp/ck" --prompt-ids 116,104,101 --max-new-tokens 8 --temperature $t --seed 5 2>&1)
  [ "$s" = "$g" ]
  check "--temperature $t samples greedy's tokens" $?
done

# row 'NEEDLE' ARGS...
row() {
  local needle=$1
  shift
  rows=$((rows + 1))
  timeout -k 5 20 "$sample" "$@" >"$tmp/out" 2>&1 </dev/null
  local rc=$?
  local why=""
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="did not end within 20 s"
  elif [ $rc -ne 2 ]; then why="exit code $rc, expected 2"
  elif ! grep -q "^error: .*$needle" "$tmp/out"; then why="no 'error:' line containing '$needle'"
  elif [ "$(grep -c '^error:' "$tmp/out")" -ne 1 ]; then why="more than one error line"
  fi
  if [ -n "$why" ]; then
    echo "FAIL [$rows] $*: $why; output:"
    head -5 "$tmp/out" | sed 's/^/    /'
    fail=1
  else
    echo "ok   [$rows] $(grep -m1 '^error:' "$tmp/out" | cut -c1-150)"
  fi
}
ck=(--checkpoint "$tmp/ck")
mkdir -p "$tmp/empty"
echo '{"config": 3}' >"$tmp/badmeta.json"
mkdir -p "$tmp/badmeta" && cp "$tmp/badmeta.json" "$tmp/badmeta/meta.json"
row 'give one of --checkpoint DIR' --prompt-ids 1
row 'give one of --checkpoint DIR' "${ck[@]}" --model "$tmp/empty" --prompt-ids 1
row 'not a directory (model.from' --model "$tmp/nowhere" --prompt-ids 1
row 'one of --prompt-ids 1,2,3 or --prompt TEXT' "${ck[@]}"
row 'one of --prompt-ids 1,2,3 or --prompt TEXT' "${ck[@]}" --prompt-ids 1 --prompt hi
row "prompt-ids 'x': expected an integer" "${ck[@]}" --prompt-ids 1,x
row "an empty item" "${ck[@]}" --prompt-ids 1,,2
row "an empty item" "${ck[@]}" --prompt-ids 1,2,
row "an empty item" "${ck[@]}" --prompt-ids ',1'
row "an empty item" "${ck[@]}" --prompt-ids '1, 2, '
row "prompt-ids: no items" "${ck[@]}" --prompt-ids ' '
# The stop id is range-checked like the prompt's ids (issue 48): outside the vocabulary it never fires.
row 'eos-token-id 256 is outside \[0, 256)' "${ck[@]}" --prompt-ids 1 --eos-token-id 256
row 'eos-token-id -2 is outside \[0, 256)' "${ck[@]}" --prompt-ids 1 --eos-token-id -2
row 'prompt token 256 at index 1 is outside \[0, 256)' "${ck[@]}" --prompt-ids 1,256
row 'nowhere: not a directory' --checkpoint "$tmp/nowhere" --prompt-ids 1
row 'neither a checkpoint' --checkpoint "$tmp/empty" --prompt-ids 1
row "no 'config' object" --checkpoint "$tmp/badmeta" --prompt-ids 1
row "dtype 'bfloat16': expected float32 or float64" "${ck[@]}" --prompt-ids 1 --dtype bfloat16
row "temperature 'warm': expected a number" "${ck[@]}" --prompt-ids 1 --temperature warm
row 'temperature -1: expected a finite number' "${ck[@]}" --prompt-ids 1 --temperature -1
row "temperature '1e400': out of range" "${ck[@]}" --prompt-ids 1 --temperature 1e400
row "temperature 'inf': out of range" "${ck[@]}" --prompt-ids 1 --temperature inf
row "temperature 'nan': expected a number" "${ck[@]}" --prompt-ids 1 --temperature nan
row 'top-k -3: expected' "${ck[@]}" --prompt-ids 1 --temperature 1 --top-k -3
row "max-new-tokens 'lots'" "${ck[@]}" --prompt-ids 1 --max-new-tokens lots
row 'seed -4: expected' "${ck[@]}" --prompt-ids 1 --seed -4
# prompt + max-new-tokens once overflowed int64 past the position check: a GPT-2 generated, then
# failed in the embedding at its last position; a Llama generated without end.
row 'max-new-tokens 9223372036854775807: with the prompt' "${ck[@]}" --prompt-ids 1,2 --max-new-tokens 9223372036854775807
row 'max-new-tokens 9223372036854775807: with the prompt' "${gck[@]}" --prompt-ids 1,2 --max-new-tokens 9223372036854775807
row 'max-new-tokens 9223372036854775805: the prompt (2 tokens)' "${gck[@]}" --prompt-ids 1,2 --max-new-tokens 9223372036854775805
row 'max-new-tokens 31: the prompt (2 tokens) and 31 new tokens exceed' "${gck[@]}" --prompt-ids 1,2 --max-new-tokens 31
# ... and before anything loads (issue 48): the flag's error, not the weights file's, and at once.
nope=(--config "$tmp/cfg.json" --set "data.path=$tmp/text.txt" --init-from "$tmp/nope.safetensors")
row 'max-new-tokens 9223372036854775807: with the prompt' "${nope[@]}" --prompt-ids 1,2 --max-new-tokens 9223372036854775807
row 'eos-token-id 256 is outside' "${nope[@]}" --prompt-ids 1 --eos-token-id 256
row 'missing.json: no such file' "${ck[@]}" --prompt hi --tokenizer "$tmp/missing.json"
# The tokenizer helper opens the file itself: a FIFO is refused as what it is, not waited on.
mkdir -p "$tmp/fifo_tok" && mkfifo "$tmp/fifo_tok/tokenizer.json"
row 'fifo_tok/tokenizer.json: not a regular file (a FIFO' "${ck[@]}" --prompt hi --tokenizer "$tmp/fifo_tok"
row 'fifo_tok/tokenizer.json: not a regular file (a FIFO' "${ck[@]}" --prompt hi --tokenizer "$tmp/fifo_tok/tokenizer.json"
row '\-\-checkpoint and \-\-init-from exclude each other' "${ck[@]}" --init-from "$tmp/w.safetensors" --prompt-ids 1
row 'nope.safetensors: cannot open' --config "$tmp/cfg.json" --set "data.path=$tmp/text.txt" --init-from "$tmp/nope.safetensors" --prompt-ids 1
row "unexpected argument 'extra'" "${ck[@]}" --prompt-ids 1 extra
# A tokenizer.json that does not load is named before anything is generated (it was exit 3 with a
# Python traceback, and with --prompt-ids the ids were never printed). Needs scripts/hf-venv.sh's venv.
if bash "$2/scripts/hf-venv.sh" --check >/dev/null 2>&1; then
  echo 'not a tokenizer' >"$tmp/garbage.json"
  echo '{}' >"$tmp/empty.json"
  row 'tokenizer .*garbage.json: not a Hugging Face tokenizer.json' "${ck[@]}" --prompt hi --tokenizer "$tmp/garbage.json"
  row 'tokenizer .*garbage.json: not a Hugging Face tokenizer.json' "${ck[@]}" --prompt-ids 1 --tokenizer "$tmp/garbage.json"
  row 'tokenizer .*empty.json: not a Hugging Face tokenizer.json' "${ck[@]}" --prompt-ids 1 --tokenizer "$tmp/empty.json"
else
  echo "skip: tokenizer rows (no venv: scripts/hf-venv.sh)"
fi
echo "$rows rows"
exit $fail
