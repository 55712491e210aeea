#!/usr/bin/env bash
# autosp-eval through the real binary: --perplexity-by-position on token shards equals one process at
# P = 2, 4 (Ulysses, with S padded to a multiple of P), a ring, and dp × sp (whose last round reads
# past the requested sequences), in float64; the buckets are the per-token losses bucketed
# (the same losses, summed another way: the mean over all buckets is the run's loss, and every
# target is counted once); --plan-memory of the evaluation program against the training step's;
# and bad input: one row each, exit 2 with an `error:` line naming it, within 20 s.
#   eval_cli.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-eval
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
unset AUTOSP_FAULT AUTOSP_COLLECTIVE_TIMEOUT
fail=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}

cat >"$tmp/cfg.json" <<'JSON'
{"model": {"arch": "llama", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 48,
           "max_position_embeddings": 256},
 "data": {"source": "synthetic", "seq_len": 62, "batch_size": 2},
 "train": {"seed": 3},
 "runtime": {"threads": 1, "dtype": "float64"}}
JSON
cat >"$tmp/gpt2.json" <<'JSON'
{"model": {"arch": "gpt2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "max_position_embeddings": 64},
 "data": {"source": "synthetic", "seq_len": 32, "batch_size": 1}, "runtime": {"threads": 1}}
JSON
$py - "$tmp" <<'PY'
import os, random, struct, sys
d = sys.argv[1]
n = 1000
rng = random.Random(5)
toks = [rng.randrange(64) for _ in range(n)]
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, n
open(os.path.join(d, "tok.bin"), "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % n, *toks))
open(os.path.join(d, "garbage.bin"), "wb").write(b"not a shard at all" * 10)
os.makedirs(os.path.join(d, "noweights"))
open(os.path.join(d, "noweights", "config.json"), "w").write(
    '{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, '
    '"num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 48}')
PY
ev=(--config "$tmp/cfg.json" --data "$tmp/tok.bin" --perplexity-by-position --bucket-width 16 --sequences 5 --quiet)

# ---- exactness across layouts -------------------------------------------------------------------
"$bin" "${ev[@]}" --out "$tmp/p1.json" 2>"$tmp/err1" || { echo "FAIL: one process"; cat "$tmp/err1"; exit 1; }
run_np() {  # run_np NAME NP SETS...
  mpirun --oversubscribe -np "$2" "$bin" "${ev[@]}" --out "$tmp/$1.json" "${@:3}" 2>"$tmp/err_$1" >/dev/null ||
    { echo "FAIL: $1 exited $?"; cat "$tmp/err_$1"; fail=1; }
}
run_np p2 2 --set sequence_parallel.autosp_size=2
run_np p4 4 --set sequence_parallel.autosp_size=4
run_np ring 4 --set sequence_parallel.autosp_size=4 --set sequence_parallel.ring_size=2
run_np dp2sp2 4 --set sequence_parallel.autosp_size=2
for name in p2 p4 ring dp2sp2; do
  check "$name equals one process" $py - "$tmp/p1.json" "$tmp/$name.json" <<'PY'
import json, math, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["tokens"] == b["tokens"] == 5 * 62, (a["tokens"], b["tokens"])
assert [x["tokens"] for x in a["buckets"]] == [x["tokens"] for x in b["buckets"]] == [80, 80, 80, 70]
for x, y in zip(a["buckets"], b["buckets"]):
    assert (x["start"], x["end"]) == (y["start"], y["end"])
    assert abs(x["loss"] - y["loss"]) <= 1e-12 * abs(x["loss"]), (x, y)
mean = sum(x["loss"] * x["tokens"] for x in a["buckets"]) / a["tokens"]
assert abs(mean - a["loss"]) < 1e-12 and abs(math.exp(a["loss"]) - a["perplexity"]) < 1e-9
PY
done

# Every window of the shard by default: ⌊(1000 − 1) / 62⌋ = 16 sequences.
"$bin" --config "$tmp/cfg.json" --data "$tmp/tok.bin" --perplexity-by-position --bucket-width 100 >"$tmp/all.json" 2>"$tmp/err_all"
check "default: one epoch, one bucket wider than S" $py -c "
import json; d = json.load(open('$tmp/all.json'))
assert d['sequences'] == 16 and d['tokens'] == 16 * 62 and len(d['buckets']) == 1 and d['buckets'][0]['end'] == 62, d"
check "non-TTY progress: one line per stage" grep -q "perplexity by position: 16/16 sequences in" "$tmp/err_all"
if command -v script >/dev/null; then  # on a terminal: one line redrawn with the rate and ETA
  script -qec "'$bin' --config '$tmp/cfg.json' --data '$tmp/tok.bin' --perplexity-by-position --out '$tmp/tty.json'" \
    /dev/null >"$tmp/tty.out" 2>&1
  check "TTY progress: redrawn with rate and ETA" grep -q $'\r.*perplexity by position: [0-9]*/16 sequences, .* sequences/s, ETA' "$tmp/tty.out"
fi

# ---- memory: the evaluation program's plan against the training step's at the same S --------------
"$bin" --config "$tmp/cfg.json" --set data.seq_len=256 --plan-memory >"$tmp/plan_eval.json" 2>/dev/null
"$1/autosp-graph" --config "$tmp/cfg.json" --plan-memory S=256,B=2 >"$tmp/plan_train.json" 2>/dev/null
check "--plan-memory: the forward-only program plans less than the training step" $py -c "
import json; e = json.load(open('$tmp/plan_eval.json')); t = json.load(open('$tmp/plan_train.json'))
assert e['bindings'] == {'B': 2, 'S': 256} and e['optimizer_bytes'] == 0, e
assert e['arena_bytes'] < t['arena_bytes'] / 2 and e['total_bytes'] < t['total_bytes'], (e['total_bytes'], t['total_bytes'])"

# ---- passkey: a byte model; the same answers at every layout, and each the greedy decoding of
# autosp-sample (one process, KV cache) on the same prompt, rebuilt here from the documented recipe
# (up to the first wrong token: exact match needs no more) -------------------------------------------
$py -c "open('$tmp/t.txt', 'w').write('hello world. ' * 200)"
cat >"$tmp/byte.json" <<JSON
{"model": {"arch": "llama", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
           "max_position_embeddings": 512},
 "data": {"source": "text", "path": "$tmp/t.txt", "seq_len": 128, "batch_size": 1},
 "runtime": {"threads": 1}}
JSON
pk=(--config "$tmp/byte.json" --passkey --passkey-lengths 120,201 --passkey-depths 0,0.5,1 --passkey-trials 2 --quiet)
"$bin" "${pk[@]}" --out "$tmp/pk1.json" 2>"$tmp/err_pk" || { echo "FAIL: passkey"; cat "$tmp/err_pk"; fail=1; }
mpirun --oversubscribe -np 2 "$bin" "${pk[@]}" --set sequence_parallel.autosp_size=2 --out "$tmp/pk2.json" 2>/dev/null
mpirun --oversubscribe -np 4 "$bin" "${pk[@]}" --set sequence_parallel.autosp_size=2 --out "$tmp/pk4.json" 2>/dev/null
mpirun --oversubscribe -np 4 "$bin" "${pk[@]}" --set sequence_parallel.autosp_size=4 --set sequence_parallel.ring_size=2 \
  --out "$tmp/pkring.json" 2>/dev/null
check "passkey: P = 2, dp 2 × sp 2 and a ring answer as one process" $py -c "
import json; a, b, c, d = (json.load(open('$tmp/pk%s.json' % n)) for n in (1, 2, 4, 'ring'))
assert a['trials'] == 12 and [(x['length'], x['depth']) for x in a['cells']] == [(L, d) for L in (120, 201) for d in (0, 0.5, 1)]
assert [x['answers'] for x in a['cells']] == [x['answers'] for x in b['cells']] == [x['answers'] for x in c['cells']] \
    == [x['answers'] for x in d['cells']]"
check "passkey: each answer is autosp-sample's greedy decoding of the prompt" $py - "$tmp/pk1.json" "$1/autosp-sample" "$tmp/byte.json" <<'PY'
import json, math, subprocess, sys
res, sample, cfg = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
filler = list(b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")
for cell in res["cells"]:
    for a in cell["answers"]:
        k = a["key"]
        key = list(f"The pass key is {k}. Remember it. {k} is the pass key. ".encode())
        question, answer = list(b"What is the pass key? The pass key is"), list(f" {k}".encode())
        F = cell["length"] - len(key) - len(question)
        at = math.floor(cell["depth"] * F + 0.5)
        prompt = [filler[i % len(filler)] for i in range(at)] + key + \
                 [filler[i % len(filler)] for i in range(at, F)] + question
        assert len(prompt) == cell["length"]
        out = subprocess.run([sample, "--config", cfg, "--prompt-ids", ",".join(map(str, prompt)), "--json",
                              "--max-new-tokens", str(len(answer))], capture_output=True, text=True, check=True)
        greedy = json.loads(out.stdout)["ids"]
        n = next((i + 1 for i, (g, t) in enumerate(zip(greedy, answer)) if g != t), len(answer))
        assert a["said_ids"] == greedy[:n], (cell["length"], cell["depth"], a, greedy)
PY

# ---- a LoRA adapter: --model BASE --set lora.from=ADAPTER equals the merged model (--merge-lora, whose
# loss PEFT's merge reproduces: ref.hf_lora), and differs from the base alone ----------------------------
tr=$1/autosp-train
"$tr" --config "$tmp/cfg.json" --steps 1 --set train.checkpoint_dir="$tmp/base_run" --quiet >/dev/null 2>"$tmp/err_base" ||
  { echo "FAIL: base run"; cat "$tmp/err_base"; fail=1; }
basedir=$(ls -d "$tmp"/base_run/step_* | tail -1)
lora_sets=(--set lora.r=4 --set lora.lora_alpha=8 --set lora.init_lora_weights=false --set lora.target_modules=all-linear)
"$tr" --config "$tmp/cfg.json" --set model.from="$basedir" "${lora_sets[@]}" --steps 1 \
  --set train.checkpoint_dir="$tmp/lora_run" --quiet >/dev/null 2>"$tmp/err_lora" || { echo "FAIL: LoRA run"; cat "$tmp/err_lora"; fail=1; }
adapter=$(ls -d "$tmp"/lora_run/step_* | tail -1)
"$tr" --config "$tmp/cfg.json" --set model.from="$basedir" --set lora.from="$adapter" --merge-lora "$tmp/merged" \
  >/dev/null 2>"$tmp/err_merge" || { echo "FAIL: --merge-lora"; cat "$tmp/err_merge"; fail=1; }
lev=(--data "$tmp/tok.bin" --perplexity-by-position --bucket-width 16 --sequences 3 --quiet --set runtime.dtype=float64)
"$bin" --model "$basedir" --set lora.from="$adapter" "${lev[@]}" --out "$tmp/l_adapter.json" 2>"$tmp/err_la" ||
  { echo "FAIL: eval with the adapter"; cat "$tmp/err_la"; fail=1; }
mpirun --oversubscribe -np 2 "$bin" --model "$basedir" --set lora.from="$adapter" "${lev[@]}" \
  --set sequence_parallel.autosp_size=2 --out "$tmp/l_adapter2.json" 2>/dev/null || { echo "FAIL: eval with the adapter, P = 2"; fail=1; }
"$bin" --model "$tmp/merged" "${lev[@]}" --out "$tmp/l_merged.json" 2>/dev/null || { echo "FAIL: eval of the merge"; fail=1; }
"$bin" --model "$basedir" "${lev[@]}" --out "$tmp/l_base.json" 2>/dev/null || { echo "FAIL: eval of the base"; fail=1; }
check "LoRA: base + adapter equals the merged model (P = 1, 2), not the base" $py - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
a, a2, m, b = (json.load(open(f"{d}/l_{n}.json"))["buckets"] for n in ("adapter", "adapter2", "merged", "base"))
for x, y, z in zip(a, a2, m):  # the merge is stored in the checkpoint's dtype: f32 rounding apart
    assert abs(x["loss"] - z["loss"]) <= 1e-6 * abs(z["loss"]), (x, z)
    assert abs(x["loss"] - y["loss"]) <= 1e-12 * abs(x["loss"]), (x, y)
assert max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b)) > 1e-4, "the adapter changed nothing"
PY

# ---- a checkpoint's own config: its meta.json holds every key, none of which the user wrote, so
# no warning names one of them; a --set key that goes unread is still warned about ------------------
"$bin" --checkpoint "$basedir" --perplexity-by-position --seq-len 32 --sequences 1 --quiet >/dev/null 2>"$tmp/err_ck" ||
  { echo "FAIL: eval of a checkpoint"; cat "$tmp/err_ck"; fail=1; }
check "--checkpoint: no warning about keys the user did not set" bash -c "! grep -i warn '$tmp/err_ck'"
"$bin" --checkpoint "$basedir" --perplexity-by-position --seq-len 32 --sequences 1 --quiet --set train.decay_type=linear \
  >/dev/null 2>"$tmp/err_ck_set" || { echo "FAIL: eval of a checkpoint with --set"; fail=1; }
check "--checkpoint: a --set key that goes unread is warned about, and only it" bash -c \
  "grep -q 'warning.*train.decay_type does not apply' '$tmp/err_ck_set' && [ \$(grep -ci warn '$tmp/err_ck_set') -eq 1 ]"

# ---- bad input ----------------------------------------------------------------------------------
. "$(dirname "$0")/lib/refusals.sh"
bad() { refused "$1" "$bin" "${@:2}"; }  # bad TEXT ARGS...: exit 2 and an error: line containing TEXT
base=(--config "$tmp/cfg.json" --data "$tmp/tok.bin" --perplexity-by-position)
bad "a LoRA adapter needs its base model" --config "$tmp/cfg.json" --set lora.from="$adapter" "${lev[@]}"
bad "--bucket-width 0: expected ≥ 1" "${base[@]}" --bucket-width 0
bad "--bucket-width -4: expected ≥ 1" "${base[@]}" --bucket-width -4
bad "--bucket-width 'x': expected an integer" "${base[@]}" --bucket-width x
bad "--sequences -1" "${base[@]}" --sequences -1
bad "--sequences 0: expected ≥ 1 (leave it out to evaluate every window)" "${base[@]}" --sequences 0
mkdir -p "$tmp/fifo_ck" && mkfifo "$tmp/fifo_ck/meta.json"
refused "fifo_ck/meta.json: a FIFO that nothing wrote to in 1 s: no process writes to it" \
  env AUTOSP_PIPE_TIMEOUT=1 "$bin" --checkpoint "$tmp/fifo_ck" --perplexity-by-position
mkdir -p "$tmp/fifo_tok" && mkfifo "$tmp/fifo_tok/tokenizer.json"
bad "fifo_tok/tokenizer.json: not a regular file (a FIFO" --config "$tmp/cfg.json" --passkey --tokenizer "$tmp/fifo_tok"
bad "--sequences 17: the data holds 16 windows of 62 + 1 tokens" "${base[@]}" --sequences 17
bad "--seq-len 0" "${base[@]}" --seq-len 0
bad "give one task" --config "$tmp/cfg.json"
bad "give one task" "${base[@]}" --plan-memory
bad "give one of --checkpoint" --perplexity-by-position
bad "exceeds model.max_position_embeddings 64" --config "$tmp/gpt2.json" --perplexity-by-position --seq-len 65
bad "fewer than seq_len + 1 = 1001" "${base[@]}" --seq-len 1000
bad "garbage.bin" --config "$tmp/cfg.json" --data "$tmp/garbage.bin" --perplexity-by-position
bad "noweights" --model "$tmp/noweights" --data "$tmp/tok.bin" --perplexity-by-position
bad "--out $tmp/missing/x.json: $tmp/missing is not a directory" "${base[@]}" --sequences 1 --out "$tmp/missing/x.json"
bad "--out" "${base[@]}" --sequences 1 --out "$tmp/tok.bin"
check "--out never touched the shard it would have overwritten" $py -c "import os; assert os.path.getsize('$tmp/tok.bin') == 1024 + 2000"
bad "sequence_parallel.autosp_size" "${base[@]}" --set sequence_parallel.autosp_size=3
pkb=(--config "$tmp/byte.json" --passkey)
bad "--passkey-depths 1.5: a depth is a fraction in \[0, 1\]" "${pkb[@]}" --passkey-depths 0,1.5
bad "--passkey-depths -0.1: a depth" "${pkb[@]}" --passkey-depths -0.1
bad "--passkey-depths 'half': expected a number" "${pkb[@]}" --passkey-depths half
bad "--passkey-depths 'nan': expected a number" "${pkb[@]}" --passkey-depths nan
bad "--passkey-lengths '1,,2': an empty item" "${pkb[@]}" --passkey-lengths 1,,2
bad "--passkey-lengths 20: too short for the key sentence and the question" "${pkb[@]}" --passkey-lengths 20
bad "--passkey-trials 0: expected 1 .. 2^20" "${pkb[@]}" --passkey-trials 0
bad "--passkey-lengths 99999999999: " "${pkb[@]}" --passkey-lengths 99999999999
bad "--passkey-lengths -5: " "${pkb[@]}" --passkey-lengths 128,-5
bad "--passkey needs the model's tokenizer" --config "$tmp/cfg.json" --passkey
bad "--passkey-lengths: a prompt of .* exceeds model.max_position_embeddings 64" \
  --config "$tmp/gpt2.json" --set model.vocab_size=256 --set data.source=text --set "data.path=$tmp/t.txt" --passkey --passkey-lengths 100
exit $fail
