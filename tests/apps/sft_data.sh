#!/usr/bin/env bash
# scripts/prepare_data.py --chat and --completion (issue 27) on a tiny chat model directory made
# offline by tests/ref/chat_fixture.py:
#   - on a ChatML template with {% generation %} markers, every conversation's tokens and mask in
#     the shards equal transformers' apply_chat_template(..., return_assistant_tokens_mask=True),
#     whole in its window;
#   - on a template without markers ([INST] ... [/INST] answer<eos>), the masked tokens decode to the
#     hand-written answers, and nothing else is masked; each conversation is one document id, its
#     first turn's EOS included;
#   - --completion masks the completion and its EOS;
#   - packing: examples never cross a window unless longer than it, the stream is N·S + 1 tokens, and
#     --long split / drop count what they did;
#   - garbage rows and flags: exit 2 with one `error:` line naming the line or flag.
# Needs the venv of scripts/hf-venv.sh (transformers, tokenizers, jinja2); exit 77 (skipped) without it.
#   sft_data.sh BIN_DIR SOURCE_DIR
set -u
src=$2
. "$src/tests/apps/lib/prep_checks.sh"  # py, prep, tmp; check and row

"$py" "$src/tests/ref/chat_fixture.py" "$tmp/chatml" --conversations "$tmp/conv.jsonl" 12 &&
  "$py" "$src/tests/ref/chat_fixture.py" "$tmp/inst" --template inst
check $? "the fixture: a byte-level BPE with ChatML specials, two chat templates"

# ---- the data: both templates, --completion, packing (whole windows, split, drop) -----------------
printf '%s\n' '{"prompt": "what is the next word after alpha?", "completion": " beta"}' \
  '{"prompt": "say mu twice:", "completion": " mu mu"}' >"$tmp/comp.jsonl"
printf '%s\n' '{"messages": [{"role": "user", "content": "mu"}, {"role": "assistant", "content": "nu"}]}' >"$tmp/short.jsonl"
o=(--tokenizer "$tmp/chatml" --val-fraction 0)
"${prep[@]}" --out "$tmp/pk" "${o[@]}" --chat --seq-len 64 --shard-tokens 100 "$tmp/conv.jsonl" >"$tmp/pk.out" 2>&1 &&
  "${prep[@]}" --out "$tmp/in" --tokenizer "$tmp/inst" --val-fraction 0 --chat --seq-len 4096 "$tmp/conv.jsonl" >/dev/null 2>&1 &&
  "${prep[@]}" --out "$tmp/co" "${o[@]}" --completion --seq-len 64 "$tmp/comp.jsonl" >/dev/null 2>&1 &&
  "${prep[@]}" --out "$tmp/sp" "${o[@]}" --chat --seq-len 24 "$tmp/conv.jsonl" >/dev/null 2>&1 &&
  "${prep[@]}" --out "$tmp/dr" "${o[@]}" --chat --seq-len 24 --long drop "$tmp/conv.jsonl" "$tmp/short.jsonl" >/dev/null 2>&1
check $? "prepare_data.py --chat (two templates), --completion, --long split and drop: $(tail -c 150 "$tmp/pk.out")"

# One Python process checks them all (transformers loads once), one line per check.
"$py" - "$tmp" <<'PY'
import glob, json, os, struct, sys
import numpy as np
from transformers import AutoTokenizer
d = sys.argv[1]

def stream(name, docs=None):
    ids, mask = [], []
    for p in sorted(glob.glob(os.path.join(d, name, "train_*.bin"))):
        raw = open(p, "rb").read()
        n = struct.unpack("<3i", raw[:12])[2]
        ids += list(struct.unpack(f"<{n}H", raw[1024:]))
        m = np.load(p[:-4] + ".npy")
        assert m.dtype == np.uint8 and m.shape == (n,), (p, m.dtype, m.shape)
        mask += [int(v) for v in m]
        doc = np.load(os.path.join(d, name, "docs_" + os.path.basename(p)[:-4] + ".npy"))
        assert doc.dtype == np.dtype("<i4") and doc.shape == (n,), (p, doc.dtype, doc.shape)
        if docs is not None:
            docs += [int(v) for v in doc]
    return ids, mask, json.load(open(os.path.join(d, name, "data.json")))

def masked_runs(hf, ids, mask):
    """The text of each maximal run of masked-in tokens."""
    runs, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(hf.decode(cur)); cur = []
    return runs + ([hf.decode(cur)] if cur else [])

convs = [json.loads(l)["messages"] for l in open(os.path.join(d, "conv.jsonl"))]
chatml = AutoTokenizer.from_pretrained(os.path.join(d, "chatml"))
hf_masks = [chatml.apply_chat_template(m, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            for m in convs]
lens = [len(r["input_ids"]) + 1 for r in hf_masks]  # with the EOS after each

def markers():
    """ChatML with {% generation %}: each conversation whole in its window of 64, its tokens and mask
    those of transformers' return_assistant_tokens_mask, then EOS and masked EOS padding."""
    ids, mask, info = stream("pk")
    S, eos = 64, info["eos_token_id"]
    assert max(lens) <= S and len(ids) == len(convs) * S + 1, (len(ids), lens)
    for w, (r, n) in enumerate(zip(hf_masks, lens)):
        win, wm = ids[w * S:(w + 1) * S], mask[w * S:(w + 1) * S]
        assert sum(r["assistant_masks"]) > 0
        assert win[:n - 1] == r["input_ids"], f"window {w}: tokens differ from apply_chat_template"
        assert wm[:n - 1] == r["assistant_masks"], f"window {w}: mask {wm[:n - 1]} vs {r['assistant_masks']}"
        assert set(win[n - 1:]) == {eos} and set(wm[n - 1:]) == {0}, f"window {w}: EOS, then masked padding"
    assert len(glob.glob(os.path.join(d, "pk", "train_*.npy"))) >= 2, "several shards, each with its mask"

def no_markers():
    """[INST] ... [/INST] answer<|endoftext|>: the masked runs are exactly the hand-written answers with
    their EOS, and the conversation ends with that EOS (none added). Its document id covers the whole
    conversation, the first turn's EOS included (EOS marking would split it there)."""
    hf = AutoTokenizer.from_pretrained(os.path.join(d, "inst"))
    docs = []
    ids, mask, info = stream("in", docs)
    assert info["data"]["doc_ids_path"] == os.path.join(d, "in", "docs_train_*.npy"), info["data"]
    at = 0
    for i, msgs in enumerate(convs):
        a1, a2 = msgs[2]["content"], msgs[4]["content"]
        want_text = (f"<<SYS>>{msgs[0]['content']}<</SYS>>[INST] {msgs[1]['content']} [/INST] {a1}<|endoftext|>"
                     f"[INST] {msgs[3]['content']} [/INST] {a2}<|endoftext|>")
        n = len(hf(want_text, add_special_tokens=False)["input_ids"])
        assert hf.decode(ids[at:at + n]) == want_text, hf.decode(ids[at:at + n])
        runs = masked_runs(hf, ids[at:at + n], mask[at:at + n])
        assert runs == [f" {a1}<|endoftext|>", f" {a2}<|endoftext|>"], f"conversation {i}: masked runs {runs}"
        assert set(docs[at:at + n]) == {i + 1}, f"conversation {i}: document ids {set(docs[at:at + n])}"
        assert ids[at:at + n - 1].count(info["eos_token_id"]) == 1  # the first turn's EOS, inside the document
        at += n
    assert set(ids[at:]) == {info["eos_token_id"]} and set(mask[at:]) == {0} and set(docs[at:]) == {0}

def completion():
    """--completion: the completion and its EOS are the masked runs."""
    ids, mask, info = stream("co")
    runs = masked_runs(chatml, ids, mask)
    assert runs == [" beta<|endoftext|>", " mu mu<|endoftext|>"], runs
    first = chatml.decode(ids[:ids.index(info["eos_token_id"]) + 1])
    assert first == "what is the next word after alpha? beta<|endoftext|>", first

def split_and_drop():
    """seq_len 24: every conversation is longer, so each is cut at window boundaries from a window's
    start (split), or left out (drop: only the short one is left)."""
    ids, mask, info = stream("sp")
    assert info["longer_than_seq_len"] == {"split": len(convs), "dropped": 0}, info["longer_than_seq_len"]
    at = 0
    for r, n in zip(hf_masks, lens):
        assert ids[at:at + n - 1] == r["input_ids"] and mask[at:at + n - 1] == r["assistant_masks"]
        at = (at + n + 23) // 24 * 24
    assert len(ids) == at + 1
    ids, mask, info = stream("dr")
    assert info["longer_than_seq_len"] == {"split": 0, "dropped": len(convs)} and info["examples"]["train"] == 1, info
    assert len(ids) == 24 + 1

failed = 0
for check in (markers, no_markers, completion, split_and_drop):
    try:
        check()
        print(f"ok   {check.__name__}: {check.__doc__.split(chr(10))[0]}")
    except AssertionError as e:
        failed += 1
        print(f"FAIL {check.__name__}: {str(e)[:300]}")
sys.exit(1 if failed else 0)
PY
check $? "--chat masks equal transformers' return_assistant_tokens_mask (markers) and the hand-written answers (no markers); --completion; packing"

# ---- garbage -----------------------------------------------------------------------------------
good='{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}'
printf '%s\n%s\n' "$good" '{"messages": [{"content": "hi"}]}' >"$tmp/norole.jsonl"
printf '%s\n%s\n' "$good" '{"messages": [{"role": "user", "content": 5}]}' >"$tmp/nonstr.jsonl"
printf '%s\n%s\n' "$good" '{"messages": [{"role": "wizard", "content": "hi"}]}' >"$tmp/role.jsonl"
printf '%s\n' '{"messages": []}' >"$tmp/empty_msgs.jsonl"
printf '%s\n' '{"messages": "hi"}' >"$tmp/str_msgs.jsonl"
printf '%s\n' '{"messages": ["hi"]}' >"$tmp/str_msg.jsonl"
printf '%s\n%s\n' "$good" '{"messages": [' >"$tmp/broken.jsonl"
printf '%s\n' '{"prompt": "a", "completion": 3}' >"$tmp/comp_bad.jsonl"
printf '%s\n' '{"prompt": "a"}' >"$tmp/comp_missing.jsonl"
echo 'a text file' >"$tmp/plain.txt"
mkdir -p "$tmp/notemplate" "$tmp/badtemplate"
cp "$tmp/chatml/tokenizer.json" "$tmp/notemplate/" && cp "$tmp/chatml/tokenizer.json" "$tmp/badtemplate/"
echo '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}' >"$tmp/notemplate/tokenizer_config.json"
echo '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "chat_template": "{{ raise_exception(\"roles must alternate\") }}"}' \
  >"$tmp/badtemplate/tokenizer_config.json"
o=(--out "$tmp/bad" --tokenizer "$tmp/chatml" --seq-len 64)
row "norole.jsonl:2: messages\[0\]: no 'role'" "${o[@]}" --chat "$tmp/norole.jsonl"
row "nonstr.jsonl:2: messages\[0\]: 'content' must be a string" "${o[@]}" --chat "$tmp/nonstr.jsonl"
row 'role.jsonl:2: messages\[0\]: unknown role "wizard"' "${o[@]}" --chat "$tmp/role.jsonl"
row "empty_msgs.jsonl:1: expected an object with a non-empty list 'messages'" "${o[@]}" --chat "$tmp/empty_msgs.jsonl"
row "str_msgs.jsonl:1: expected an object with a non-empty list 'messages'" "${o[@]}" --chat "$tmp/str_msgs.jsonl"
row 'str_msg.jsonl:1: messages\[0\]: expected an object' "${o[@]}" --chat "$tmp/str_msg.jsonl"
row 'broken.jsonl:2: not valid JSON' "${o[@]}" --chat "$tmp/broken.jsonl"
row "comp_bad.jsonl:1: 'completion' must be a string" "${o[@]}" --completion "$tmp/comp_bad.jsonl"
row "comp_missing.jsonl:1: 'completion' must be a string" "${o[@]}" --completion "$tmp/comp_missing.jsonl"
row 'plain.txt: \-\-chat reads .jsonl files' "${o[@]}" --chat "$tmp/plain.txt"
row 'has no chat_template' --out "$tmp/bad" --tokenizer "$tmp/notemplate" --seq-len 64 --chat "$tmp/conv.jsonl"
row 'conv.jsonl:1: the chat template cannot render this conversation (roles must alternate)' \
  --out "$tmp/bad" --tokenizer "$tmp/badtemplate" --seq-len 64 --chat "$tmp/conv.jsonl"
row '\-\-chat needs a model directory' --out "$tmp/bad" --tokenizer "$tmp/chatml/tokenizer.json" --seq-len 64 --chat "$tmp/conv.jsonl"
row '\-\-chat needs \-\-tokenizer DIR' --out "$tmp/bad" --train-tokenizer --vocab-size 300 --seq-len 64 --chat "$tmp/conv.jsonl"
row '\-\-seq-len 0' --out "$tmp/bad" --tokenizer "$tmp/chatml" --chat "$tmp/conv.jsonl"
row '\-\-seq-len 1' "${o[@]}" --seq-len 1 --chat "$tmp/conv.jsonl"
row '\-\-chat and \-\-completion exclude each other' "${o[@]}" --chat --completion "$tmp/conv.jsonl"
row '\-\-seq-len and \-\-long apply to \-\-chat, \-\-completion and \-\-preference' --out "$tmp/bad" --tokenizer "$tmp/chatml" --seq-len 64 "$tmp/plain.txt"
row "argument \-\-long: invalid choice: 'cut'" "${o[@]}" --chat --long cut "$tmp/conv.jsonl"
row 'every train example is longer than \-\-seq-len 8' --out "$tmp/bad" --tokenizer "$tmp/chatml" --seq-len 8 --long drop --chat "$tmp/conv.jsonl"
# Conversations without an assistant turn (issue 48): --chat learns only the assistant's tokens, so a
# train split without one is refused before anything is written (it wrote data with 0 targets and
# exited 0); a validation split without one is a warning.
user_only='{"messages": [{"role": "user", "content": "hi"}]}'
printf '%s\n%s\n' "$user_only" '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}' \
  >"$tmp/noassist.jsonl"
row 'noassist.jsonl: no conversation of the train split (2) has an assistant turn: \-\-chat learns only the assistant' \
  --out "$tmp/noassist" --tokenizer "$tmp/chatml" --seq-len 64 --val-fraction 0 --chat "$tmp/noassist.jsonl"
[ ! -e "$tmp/noassist" ]
check $? "the refused --chat run wrote nothing (no --out directory)"
printf '%s\n%s\n' "$user_only" "$good" >"$tmp/valnoassist.jsonl"  # --seed 0 puts conversation 1 in val
"${prep[@]}" --out "$tmp/vn" --tokenizer "$tmp/chatml" --seq-len 64 --val-fraction 0.5 --seed 0 --chat \
  "$tmp/valnoassist.jsonl" >"$tmp/vn.out" 2>"$tmp/vn.err" &&
  grep -q '^warning: no conversation of the validation split (1) has an assistant turn' "$tmp/vn.err" &&
  grep -q '"targets": {"train": [1-9][0-9]*, "val": 0}' "$tmp/vn.out"
check $? "a validation split without an assistant turn: a warning, exit 0: $(head -c 200 "$tmp/vn.err")"

# scripts/chat_prompt.py's own mistakes, and what it prints.
prompt=("$py" "$src/scripts/chat_prompt.py")
prep=("${prompt[@]}")  # what row runs from here on
row 'has no chat_template' "$tmp/notemplate" "hi"
row 'give MESSAGE or \-\-turn-end' "$tmp/chatml"
row '\-\-chat needs a model directory' "$tmp/conv.jsonl" "hi"
row 'unrecognized arguments: \-\-bogus' "$tmp/chatml" --bogus "hi"
[ "$("${prompt[@]}" "$tmp/chatml" --turn-end 2>&1)" = 2 ] &&
  [ "$("${prompt[@]}" "$tmp/chatml" --ids hi 2>&1)" = "$("$py" -c '
import sys; from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
print(",".join(map(str, t.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True))))' "$tmp/chatml" 2>/dev/null)" ]
check $? "chat_prompt.py: --turn-end is <|im_end|> (id 2), --ids equals apply_chat_template(add_generation_prompt=True)"

echo "$rows rows"
exit $fail
