#!/usr/bin/env bash
# scripts/prepare_data.py --preference (issue 44) on the tiny chat model directory of
# tests/ref/chat_fixture.py, made offline:
#   - every pair's chosen and rejected sequences equal TRL's DPOTrainer tokenization, written out here
#     from TRL's rules (maybe_extract_prompt, maybe_apply_chat_template, tokenize_row: prompt and
#     completion tokenized apart, EOS after the completion, no BOS for a decoder-only model, also
#     where the tokenizer has one), for string rows, explicit conversational rows and implicit-prompt
#     rows; the mask is 1 exactly on the completion and its EOS;
#   - both sequences of a pair lie in one window, chosen first, with pair ids k + 1 / -(k + 1);
#     padding has id 0 and mask 0; a pair longer than the window is left out and counted;
#   - garbage rows and flags: exit 2 with one `error:` line naming the line or flag.
# Needs the venv of scripts/hf-venv.sh (transformers, tokenizers, jinja2); exit 77 (skipped) without it.
#   preference_data.sh BIN_DIR SOURCE_DIR
set -u
src=$2
. "$src/tests/apps/lib/prep_checks.sh"  # py, prep, tmp; check and row

"$py" "$src/tests/ref/chat_fixture.py" "$tmp/chatml"
check $? "the fixture: a byte-level BPE with ChatML specials and its chat template"

u() { printf '{"role": "user", "content": "%s"}' "$1"; }
a() { printf '{"role": "assistant", "content": "%s"}' "$1"; }
{
  echo '{"prompt": "what is the next word after alpha?", "chosen": " beta", "rejected": " gamma delta"}'
  echo "{\"prompt\": [$(u 'say mu twice')], \"chosen\": [$(a 'mu mu')], \"rejected\": [$(a 'nu')]}"
  echo "{\"chosen\": [$(u 'say xi'), $(a 'xi')], \"rejected\": [$(u 'say xi'), $(a 'pi pi pi')]}"
  echo '{"prompt": "say it twice please:", "chosen": " tau tau", "rejected": " tau"}'
  echo "{\"prompt\": \"$(printf 'alpha %.0s' $(seq 40))\", \"chosen\": \" beta\", \"rejected\": \" gamma\"}"  # too long
} >"$tmp/pairs.jsonl"
"${prep[@]}" --out "$tmp/p" --tokenizer "$tmp/chatml" --val-fraction 0 --preference --seq-len 64 --shard-tokens 100 \
  "$tmp/pairs.jsonl" >"$tmp/p.out" 2>&1
check $? "prepare_data.py --preference: $(tail -c 150 "$tmp/p.out")"
mkdir -p "$tmp/bos" && cp "$tmp/chatml/tokenizer.json" "$tmp/bos/" &&
  "$py" -c 'import json, sys; c = json.load(open(sys.argv[1])); c.update(bos_token="<|im_start|>", add_bos_token=True)
json.dump(c, open(sys.argv[2], "w"))' "$tmp/chatml/tokenizer_config.json" "$tmp/bos/tokenizer_config.json" &&
  "${prep[@]}" --out "$tmp/pb" --tokenizer "$tmp/bos" --val-fraction 0 --preference --seq-len 64 --shard-tokens 100 "$tmp/pairs.jsonl" >/dev/null 2>&1 &&
  cmp -s "$tmp/p/train_000000.bin" "$tmp/pb/train_000000.bin"
check $? "a tokenizer with a BOS (add_bos_token): the same tokens, no BOS added (TRL adds none for a decoder-only model)"

"$py" - "$tmp" <<'PY'
import glob, json, os, struct, sys
import numpy as np
from transformers import AutoTokenizer
d = sys.argv[1]
S = 64
hf = AutoTokenizer.from_pretrained(os.path.join(d, "chatml"))
eos = hf.eos_token_id

ids, mask, pair = [], [], []
for p in sorted(glob.glob(os.path.join(d, "p", "train_*.bin"))):
    raw = open(p, "rb").read()
    n = struct.unpack("<3i", raw[:12])[2]
    ids += list(struct.unpack(f"<{n}H", raw[1024:]))
    m = np.load(p[:-4] + ".npy")
    q = np.load(os.path.join(d, "p", "pairs_" + os.path.basename(p)[:-4] + ".npy"))
    assert m.dtype == np.uint8 and m.shape == (n,) and q.dtype == np.int32 and q.shape == (n,), (p, q.dtype, q.shape)
    mask += m.tolist()
    pair += q.tolist()
info = json.load(open(os.path.join(d, "p", "data.json")))

def trl(row):
    """TRL's DPOTrainer: the implicit prompt, the chat template, then tokenize_row (prompt and completion
    apart, add_special_tokens=False; BOS before the prompt where there is one, EOS after each completion)."""
    if "prompt" not in row:  # maybe_extract_prompt
        c, r = row["chosen"], row["rejected"]
        idx = next(i for i in range(min(len(c), len(r))) if c[i] != r[i])
        row = {"prompt": c[:idx], "chosen": c[idx:], "rejected": r[idx:]}
    if isinstance(row["prompt"], list):  # maybe_apply_chat_template
        prompt = hf.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        row = {"prompt": prompt, **{k: hf.apply_chat_template(row["prompt"] + row[k], tokenize=False)[len(prompt):]
                                    for k in ("chosen", "rejected")}}
    p = hf(row["prompt"], add_special_tokens=False)["input_ids"]  # add_special_tokens: only encoder-decoders
    return [(p, hf(row[k], add_special_tokens=False)["input_ids"] + [eos]) for k in ("chosen", "rejected")]

rows = [json.loads(l) for l in open(os.path.join(d, "pairs.jsonl"))]
failed = 0
def expect(ok, what):
    global failed
    failed += not ok
    print(("ok   " if ok else "FAIL ") + what)

kept = rows[:4]
expect(info["examples"]["train"] == 4 and info["longer_than_seq_len"] == {"split": 0, "dropped": 1},
       f"4 pairs kept, the one longer than 64 tokens left out: {info['examples']}, {info['longer_than_seq_len']}")
expect(info["pairs_path"].endswith("pairs_train_*.npy") and info["data"]["document_mask"] is True,
       "data.json names the pair ids and sets data.document_mask")
expect(len(ids) % S == 1 and ids[-1] == eos and pair[-1] == 0, f"whole windows plus the final EOS ({len(ids)} tokens)")
for k, row in enumerate(kept):
    for sign, (p, c) in zip((1, -1), trl(row)):
        at = [i for i, v in enumerate(pair) if v == sign * (k + 1)]
        name = f"pair {k} {'chosen' if sign > 0 else 'rejected'}"
        expect(at == list(range(at[0], at[0] + len(p) + len(c))), f"{name}: contiguous")
        expect([ids[i] for i in at] == p + c, f"{name}: tokens equal TRL's: {hf.decode([ids[i] for i in at])!r}")
        expect([mask[i] for i in at] == [0] * len(p) + [1] * len(c), f"{name}: the mask is the completion and its EOS")
    first = [i for i, v in enumerate(pair) if abs(v) == k + 1]
    expect(first[0] // S == first[-1] // S and pair[first[0]] == k + 1, f"pair {k}: one window, chosen first")
expect(all(m == 0 for m, v in zip(mask, pair) if v == 0), "tokens outside pairs (padding) have mask 0")
sys.exit(1 if failed else 0)
PY
check $? "--preference: tokens and masks equal TRL's tokenization, pairs whole in a window, pair ids"
"${prep[@]}" --out "$tmp/v" --tokenizer "$tmp/chatml" --val-fraction 0.4 --preference --seq-len 64 "$tmp/pairs.jsonl" \
  >"$tmp/v.out" 2>&1 &&
  "$py" -c 'import json, sys, numpy as np
d = sys.argv[1]; info = json.load(open(d + "/data.json"))
ids = {s: sorted(set(np.load(f"{d}/pairs_{s}_000000.npy").tolist()) - {0}) for s in ("train", "val")}
assert info["val_pairs_path"] == d + "/pairs_val_*.npy" and info["examples"] == {"train": 2, "val": 2}, info
assert ids == {"train": [-2, -1, 1, 2], "val": [-2, -1, 1, 2]}, ids' "$tmp/v"
check $? "--val-fraction: the validation split has its own pair ids (from 1) in pairs_val_*.npy: $(tail -c 120 "$tmp/v.out")"

# ---- garbage -----------------------------------------------------------------------------------
good='{"prompt": "hi", "chosen": " ok", "rejected": " no"}'
bad() { printf '%s\n%s\n' "$good" "$2" >"$tmp/$1.jsonl"; }
bad nochosen '{"prompt": "hi", "rejected": " no"}'
bad norejected '{"prompt": "hi", "chosen": " ok"}'
bad noprompt '{"chosen": " ok", "rejected": " no"}'
bad emptychosen '{"prompt": "hi", "chosen": "", "rejected": " no"}'
bad emptyrejected "{\"prompt\": [$(u hi)], \"chosen\": [$(a ok)], \"rejected\": [$(a '')]}"
bad mixed "{\"prompt\": \"hi\", \"chosen\": [$(a ok)], \"rejected\": [$(a no)]}"
bad numeric '{"prompt": "hi", "chosen": 3, "rejected": " no"}'
bad badrole "{\"prompt\": [{\"role\": \"wizard\", \"content\": \"hi\"}], \"chosen\": [$(a ok)], \"rejected\": [$(a no)]}"
bad noshared "{\"chosen\": [$(u hi), $(a ok)], \"rejected\": [$(u yo), $(a no)]}"
bad notobj '["hi", " ok", " no"]'
bad broken '{"prompt": "hi", "chosen":'
o=(--out "$tmp/bad" --overwrite --tokenizer "$tmp/chatml" --seq-len 64 --preference)
row "nochosen.jsonl:2: no 'chosen'" "${o[@]}" "$tmp/nochosen.jsonl"
row "norejected.jsonl:2: no 'rejected'" "${o[@]}" "$tmp/norejected.jsonl"
row "noprompt.jsonl:2: 'prompt' must be a string" "${o[@]}" "$tmp/noprompt.jsonl"
row "emptychosen.jsonl:2: 'chosen' is an empty completion" "${o[@]}" "$tmp/emptychosen.jsonl"
row "emptyrejected.jsonl:2: 'rejected' is an empty completion" "${o[@]}" "$tmp/emptyrejected.jsonl"
row "mixed.jsonl:2: 'prompt', 'chosen' and 'rejected' must all be strings or all lists" "${o[@]}" "$tmp/mixed.jsonl"
row "numeric.jsonl:2: 'prompt', 'chosen' and 'rejected' must all be strings or all lists" "${o[@]}" "$tmp/numeric.jsonl"
row 'badrole.jsonl:2: prompt\[0\]: unknown role "wizard"' "${o[@]}" "$tmp/badrole.jsonl"
row "noshared.jsonl:2: no 'prompt', and 'chosen' and 'rejected' share no leading message" "${o[@]}" "$tmp/noshared.jsonl"
row 'notobj.jsonl:2: expected an object {prompt, chosen, rejected}' "${o[@]}" "$tmp/notobj.jsonl"
row 'broken.jsonl:2: not valid JSON' "${o[@]}" "$tmp/broken.jsonl"
# A template that renders the prompt one way alone (with the generation prompt) and another way
# before an answer: the pair has no common prompt.
mkdir -p "$tmp/shifty" && cp "$tmp/chatml/tokenizer.json" "$tmp/shifty/"
echo '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "chat_template": "{%- for m in messages %}{%- if loop.last and m[\"role\"] == \"assistant\" %}<|im_start|>bot {{ m[\"content\"] }}{%- else %}<|im_start|>{{ m[\"role\"] }} {{ m[\"content\"] }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant {% endif %}"}' \
  >"$tmp/shifty/tokenizer_config.json"
printf '%s\n' "{\"prompt\": [$(u hi)], \"chosen\": [$(a ok)], \"rejected\": [$(a no)]}" >"$tmp/conv.jsonl"
row "conv.jsonl:1: the prompt renders differently before 'chosen'" --out "$tmp/bad" --overwrite --tokenizer "$tmp/shifty" \
  --seq-len 64 --preference "$tmp/conv.jsonl"
row '\-\-chat and \-\-preference exclude each other' "${o[@]}" --chat "$tmp/pairs.jsonl"
row '\-\-long split: a preference pair is never cut' "${o[@]}" --long split "$tmp/pairs.jsonl"
row '\-\-preference needs \-\-tokenizer DIR' --out "$tmp/bad" --train-tokenizer --vocab-size 300 --seq-len 64 \
  --preference "$tmp/pairs.jsonl"
row 'every train pair (both sequences together) is longer than \-\-seq-len 8' --out "$tmp/bad" --overwrite \
  --tokenizer "$tmp/chatml" --seq-len 8 --preference "$tmp/pairs.jsonl"
# That refusal comes while the new shards are being written: with --overwrite over an earlier run's
# output, the earlier files stay exactly as they were and nothing of the refused run is left.
cp -r "$tmp/p" "$tmp/keep"
row 'every train pair (both sequences together) is longer than \-\-seq-len 8' --out "$tmp/p" --overwrite \
  --tokenizer "$tmp/chatml" --seq-len 8 --preference "$tmp/pairs.jsonl"
diff -r "$tmp/keep" "$tmp/p" >/dev/null && [ -z "$(find "$tmp/p" -name '.prepare_data-*')" ]
check $? "a refused --overwrite run leaves the earlier output as it was, and no staging folder"
echo "$rows rows"
exit $fail
