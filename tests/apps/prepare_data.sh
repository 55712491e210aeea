#!/usr/bin/env bash
# scripts/prepare_data.py end to end: text paragraphs and JSONL documents become llm.c shards with a
# train/val split and an EOS token after every document; decoding the shards with the saved
# tokenizer.json gives back exactly the documents; autosp-train trains on them with validation;
# autosp-sample continues a text prompt through the same tokenizer. A second run into the same --out
# is refused, and with --overwrite leaves no shard of the first (issue 31); "<|endoftext|>" written
# inside a document stays text (one EOS per document); documents begin with BOS exactly where
# transformers' tokenizer(text) puts one (issue 26). Then one row per malformed input: exit 2 and
# exactly one line, `error:` with the row's text; and a table of garbage inputs run in one process
# (random bytes, truncated JSONL, invalid UTF-8, non-object lines, a directory...): each exit 2 with
# one `error:` line naming the file, never a traceback. Needs the venv of scripts/hf-venv.sh
# (Hugging Face tokenizers); exit 77 (skipped) without it.
#   prepare_data.sh BIN_DIR SOURCE_DIR
set -u
bin=$1
src=$2
. "$src/tests/apps/lib/prep_checks.sh"  # py, prep, tmp; check and row

"$py" - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
paras = [" ".join(words[(i * 7 + j) % len(words)] for j in range(30 + i % 13)) + f" — no. {i} ü" for i in range(40)]
open(os.path.join(d, "book.txt"), "w", encoding="utf-8").write("\n\n".join(paras) + "\n")
with open(os.path.join(d, "web.jsonl"), "w", encoding="utf-8") as f:
    for i in range(20):
        f.write(json.dumps({"id": i, "text": f"document {i}: " + " ".join(words[i % 12:] + words[:i % 12])}) + "\n")
json.dump(paras + [json.loads(l)["text"] for l in open(os.path.join(d, "web.jsonl"), encoding="utf-8")],
          open(os.path.join(d, "docs.json"), "w"))
PY
"${prep[@]}" --out "$tmp/data" --train-tokenizer --vocab-size 300 --paragraphs --val-fraction 0.1 --shard-tokens 2000 \
  "$tmp/book.txt" "$tmp/web.jsonl" >"$tmp/prep.out" 2>&1
check $? "prepare_data.py trains a BPE and writes shards: $(tail -1 "$tmp/prep.out" | cut -c1-200)"
grep -q "^tokenizing: [0-9]* documents$" "$tmp/prep.out" && grep -q "^tokenizing: \([0-9]*\)/\1 documents in " "$tmp/prep.out"
check $? "progress off a terminal: a line when tokenizing starts and one when it ends"

"$py" - "$tmp" <<'PY'
import glob, json, os, struct, sys
from tokenizers import Tokenizer
d = sys.argv[1]
info = json.load(open(os.path.join(d, "data", "data.json")))
tok = Tokenizer.from_file(os.path.join(d, "data", "tokenizer.json"))
eos = info["eos_token_id"]
assert tok.id_to_token(eos) == "<|endoftext|>", "EOS is <|endoftext|>"
want = sorted(json.load(open(os.path.join(d, "docs.json"))))
got, counts = [], {}
for split in ("train", "val"):
    ids = []
    files = sorted(glob.glob(os.path.join(d, "data", f"{split}_*.bin")))
    for p in files:
        raw = open(p, "rb").read()
        magic, version, n = struct.unpack("<3i", raw[:12])
        assert (magic, version) == (20240520, 1), (p, magic, version)
        assert len(raw) == 1024 + 2 * n, p
        ids += list(struct.unpack(f"<{n}H", raw[1024:]))
    assert ids and ids[-1] == eos, f"{split}: every document ends with EOS"
    docs, cur = [], []
    for t in ids:
        if t == eos:
            docs.append(tok.decode(cur)); cur = []
        else:
            cur.append(t)
    counts[split] = (len(files), len(docs))
    got += docs
assert counts["train"][0] >= 2, f"several train shards of ≤ 2000 tokens: {counts}"
assert counts["val"][1] == 6, f"10% of 60 documents in val: {counts}"
assert sorted(got) == want, "the shards decode to exactly the documents"
print("round trip ok:", counts)
PY
check $? "the shards decode to the documents, EOS after each, 10% of them in val"

cat >"$tmp/cfg.json" <<JSON
{"model": {"arch": "gpt2", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
           "max_position_embeddings": 64},
 "data": {"source": "tokens", "path": "$tmp/data/train_*.bin", "val_path": "$tmp/data/val_*.bin", "seq_len": 32,
          "batch_size": 2},
 "train": {"steps": 4, "eval_every": 2, "eval_batches": 2, "log_every": 1, "checkpoint_dir": "$tmp/ck"},
 "runtime": {"threads": 1}}
JSON
"$bin/autosp-train" --config "$tmp/cfg.json" >"$tmp/train.out" 2>&1 && grep -q 'step 4/4 | val loss' "$tmp/train.out"
check $? "autosp-train trains on them with validation: $(grep -m1 'val loss' "$tmp/train.out" | cut -c30-)"
"$bin/autosp-sample" --checkpoint "$tmp/ck" --tokenizer "$tmp/data/tokenizer.json" --prompt "alpha beta" \
  --max-new-tokens 6 >"$tmp/sample.out" 2>&1 && grep -q '^text: ' "$tmp/sample.out" && grep -q '^ids: ' "$tmp/sample.out"
check $? "autosp-sample continues a text prompt through tokenizer.json: $(tr '\n' ' ' <"$tmp/sample.out" | cut -c1-160)"

# A reused --out: refused while it holds an earlier run's files; --overwrite removes every one of
# them (the first run wrote 2+ train shards, this one writes 1) and leaves other files alone.
echo "notes" >"$tmp/data/README"
"${prep[@]}" --out "$tmp/data" --train-tokenizer --vocab-size 280 "$tmp/web.jsonl" >"$tmp/again.out" 2>&1
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$tmp/again.out")" -eq 1 ] \
  && grep -q "^error: --out $tmp/data: holds the output of an earlier run (.*give --overwrite" "$tmp/again.out"
check $? "a second run into the same --out is refused: exit $rc, $(head -c 150 "$tmp/again.out")"
"${prep[@]}" --out "$tmp/data" --train-tokenizer --vocab-size 280 --val-fraction 0 --overwrite "$tmp/web.jsonl" \
  >"$tmp/again.out" 2>&1 && "$py" - "$tmp/data" <<'PY'
import glob, json, os, struct, sys
from tokenizers import Tokenizer
d = sys.argv[1]
info = json.load(open(os.path.join(d, "data.json")))
assert Tokenizer.from_file(os.path.join(d, "tokenizer.json")).get_vocab_size() == info["model"]["vocab_size"] == 280
for split in ("train", "val"):
    files = sorted(glob.glob(os.path.join(d, f"{split}_*.bin")))
    n = sum(struct.unpack("<3i", open(p, "rb").read(12))[2] for p in files)
    assert n == info["tokens"][split], f"{split}_*.bin hold {n} tokens in {len(files)} files, data.json says {info['tokens']}"
assert info["documents"] == {"train": 20, "val": 0} and not glob.glob(os.path.join(d, "val_*.bin")), info
assert open(os.path.join(d, "README")).read() == "notes\n", "other files stay"
PY
check $? "--overwrite: train_*.bin and val_*.bin hold exactly the new run's tokens, tokenizer.json is the new one"

# "<|endoftext|>" inside a document is text: one EOS per document, with a trained and a given tokenizer.
printf '%s\n' '{"text": "alpha <|endoftext|> beta"}' '{"text": "gamma</s><eos> delta"}' >"$tmp/special.jsonl"
"${prep[@]}" --out "$tmp/sp1" --train-tokenizer --vocab-size 300 --val-fraction 0 "$tmp/special.jsonl" >/dev/null 2>&1 \
  && "${prep[@]}" --out "$tmp/sp2" --tokenizer "$tmp/data/tokenizer.json" --val-fraction 0 "$tmp/special.jsonl" \
    >/dev/null 2>&1 && "$py" - "$tmp" <<'PY'
import json, os, struct, sys
from tokenizers import Tokenizer
for d in (os.path.join(sys.argv[1], "sp1"), os.path.join(sys.argv[1], "sp2")):
    info = json.load(open(os.path.join(d, "data.json")))
    raw = open(os.path.join(d, "train_000000.bin"), "rb").read()
    ids = list(struct.unpack(f"<{struct.unpack('<3i', raw[:12])[2]}H", raw[1024:]))
    eos = info["eos_token_id"]
    assert ids.count(eos) == info["documents"]["train"] == 2, f"{d}: {ids.count(eos)} EOS ids for {info['documents']}"
    assert ids[-1] == eos
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    docs = [tok.decode(ids[:ids.index(eos)]), tok.decode(ids[ids.index(eos) + 1:-1])]
    assert docs == ["alpha <|endoftext|> beta", "gamma</s><eos> delta"], docs
PY
check $? "special-token text inside a document is encoded as text: 2 EOS ids for 2 documents"

# BOS where the tokenizer puts one (issue 26): a Llama 3-like tokenizer (post-processor
# "<|begin_of_text|> $A", EOS <|end_of_text|>), a Llama 2-like one whose tokenizer_config.json
# turns add_bos_token off, and one without a post-processor. Each document in the shards is what
# transformers' AutoTokenizer(dir)(text) gives, then EOS; data.json names the BOS.
"$py" - "$tmp" <<'PY'
import json, os, sys
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
d = sys.argv[1]
words = "alpha beta gamma delta epsilon zeta eta theta".split()
texts = [" ".join(words[i % 8:] + words[:i % 8]) for i in range(30)]
for name, bos, eos, template, config in [
        ("llama3", "<|begin_of_text|>", "<|end_of_text|>", True,
         {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
        ("llama2", "<s>", "</s>", True,
         {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False, "add_eos_token": False, "bos_token": "<s>",
          "eos_token": "</s>", "legacy": False}),
        ("plain", "<s>", "</s>", False, {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"})]:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", bos, eos], show_progress=False))
    if template:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    os.makedirs(os.path.join(d, "bos", name))
    tok.save(os.path.join(d, "bos", name, "tokenizer.json"))
    if config:
        json.dump(config, open(os.path.join(d, "bos", name, "tokenizer_config.json"), "w"))
with open(os.path.join(d, "bos", "docs.jsonl"), "w") as f:
    for t in texts[:5]:
        f.write(json.dumps({"text": t}) + "\n")
PY
for name in llama3 llama2 plain; do
  "${prep[@]}" --out "$tmp/bos/out_$name" --tokenizer "$tmp/bos/$name" --val-fraction 0 "$tmp/bos/docs.jsonl" \
    >"$tmp/bos/$name.out" 2>&1 || cat "$tmp/bos/$name.out"
done
"$py" - "$tmp/bos" <<'PY'
import json, os, struct, sys
from transformers import AutoTokenizer
d = sys.argv[1]
texts = [json.loads(l)["text"] for l in open(os.path.join(d, "docs.jsonl"))]
for name, want_bos in (("llama3", "<|begin_of_text|>"), ("llama2", None), ("plain", None)):
    out = os.path.join(d, f"out_{name}")
    info = json.load(open(os.path.join(out, "data.json")))
    raw = open(os.path.join(out, "train_000000.bin"), "rb").read()
    ids = list(struct.unpack(f"<{struct.unpack('<3i', raw[:12])[2]}H", raw[1024:]))
    hf = AutoTokenizer.from_pretrained(os.path.join(d, name))
    eos = info["eos_token_id"]
    want = []
    for t in texts:
        want += hf(t)["input_ids"] + [eos]
    assert ids == want, f"{name}: shards {ids[:20]}... vs transformers {want[:20]}..."
    bos = hf.convert_tokens_to_ids(want_bos) if want_bos else None
    assert info["bos_token_id"] == bos, f"{name}: data.json bos_token_id {info['bos_token_id']}, want {bos}"
    assert (ids[0] == bos) == (want_bos is not None), name
print("BOS as transformers puts it: llama3 yes, llama2 (add_bos_token false) no, plain no")
PY
check $? "documents begin with BOS exactly where transformers' tokenizer(text) puts one"

printf '{"text": "fine"}\n{"text": \n' >"$tmp/broken.jsonl"
printf '{"body": "no text key"}\n' >"$tmp/nokey.jsonl"
printf '\xff\xfe\x00bad' >"$tmp/binary.txt"
echo 'not a tokenizer' >"$tmp/garbage.json"
echo '{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}' >"$tmp/noeos.json"
printf '{"text": "ok"}\n{"text": "caf\xff"}\n' >"$tmp/ff.jsonl"
echo '{"text": "\ud800"}' >"$tmp/surrogate.jsonl"
: >"$tmp/empty.txt"
printf 'one paragraph\n\nanother\n' >"$tmp/two.txt"
o=(--out "$tmp/bad")
row 'missing.txt: not a file' "${o[@]}" --train-tokenizer --vocab-size 300 "$tmp/missing.txt"
row 'broken.jsonl:2: not valid JSON' "${o[@]}" --train-tokenizer --vocab-size 300 "$tmp/broken.jsonl"
row "nokey.jsonl:1: expected an object with a string field 'text'" "${o[@]}" --train-tokenizer --vocab-size 300 "$tmp/nokey.jsonl"
row 'binary.txt: not UTF-8 text' "${o[@]}" --train-tokenizer --vocab-size 300 "$tmp/binary.txt"
row 'garbage.json: not a Hugging Face tokenizer.json' "${o[@]}" --tokenizer "$tmp/garbage.json" "$tmp/book.txt"
row 'the tokenizer has no EOS token' "${o[@]}" --tokenizer "$tmp/noeos.json" "$tmp/book.txt"
row 'no tokenizer.json there' "${o[@]}" --tokenizer "$tmp" "$tmp/book.txt"
row 'give one of --tokenizer FILE or --train-tokenizer' "${o[@]}" "$tmp/book.txt"
row '\-\-vocab-size 100: a byte-level BPE needs at least 257' "${o[@]}" --train-tokenizer --vocab-size 100 "$tmp/book.txt"
row '\-\-val-fraction 1.5' "${o[@]}" --train-tokenizer --vocab-size 300 --val-fraction 1.5 "$tmp/book.txt"
row '\-\-shard-tokens 0' "${o[@]}" --train-tokenizer --vocab-size 300 --shard-tokens 0 "$tmp/book.txt"
row '\-\-vocab-size: invalid int value' "${o[@]}" --train-tokenizer --vocab-size many "$tmp/book.txt"
row 'ff.jsonl:2: not UTF-8 text' "${o[@]}" --train-tokenizer --vocab-size 300 "$tmp/ff.jsonl"
row "surrogate.jsonl:1: field 'text' holds a lone surrogate" "${o[@]}" --train-tokenizer --vocab-size 300 "$tmp/surrogate.jsonl"
row "\-\-out $tmp/book.txt: exists and is not a directory" --out "$tmp/book.txt" --train-tokenizer --vocab-size 300 "$tmp/web.jsonl"
row 'empty.txt: holds no document' "${o[@]}" --train-tokenizer --vocab-size 300 "$tmp/empty.txt"
mkdir -p "$tmp/badcfg" "$tmp/nobos"
cp "$tmp/bos/llama3/tokenizer.json" "$tmp/badcfg/" && cp "$tmp/bos/llama3/tokenizer.json" "$tmp/nobos/"
printf '{"add_bos_token": tr' >"$tmp/badcfg/tokenizer_config.json"
echo '{"add_bos_token": true, "bos_token": "<bos_not_there>"}' >"$tmp/nobos/tokenizer_config.json"
row 'badcfg/tokenizer_config.json: not a readable tokenizer_config.json' "${o[@]}" --tokenizer "$tmp/badcfg" "$tmp/web.jsonl"
row 'add_bos_token is true but its bos_token "<bos_not_there>" is not in the tokenizer' "${o[@]}" --tokenizer "$tmp/nobos/tokenizer.json" "$tmp/web.jsonl"
row '\-\-val-fraction 0.9: puts all 2 documents into the validation split, so the train split is empty' \
  "${o[@]}" --train-tokenizer --vocab-size 300 --paragraphs --val-fraction 0.9 "$tmp/two.txt"

# Garbage inputs, one process (prepare_data.main() per case; a traceback is any exception but exit 2).
"$py" - "$tmp" "$src/scripts/prepare_data.py" <<'PY'
import contextlib, importlib.util, io, json, os, random, sys, traceback
tmp, script = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("prepare_data", script)
prep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prep)
g = os.path.join(tmp, "garbage")
os.makedirs(g)
rng = random.Random(31)
cases = []  # (file the error must name, extra args, input)


def put(name, data, args=()):
    path = os.path.join(g, name)
    open(path, "wb").write(data)
    cases.append((name, list(args), path))


for i in range(4):
    for ext in ("txt", "jsonl"):
        put(f"random{i}.{ext}", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))) + b"\xff")
line = json.dumps({"id": 7, "text": "über — ü"}, ensure_ascii=False).encode()
for cut in range(1, len(line) - 1, 3):
    put(f"truncated{cut}.jsonl", b'{"text": "fine"}\n' + line[:cut])
for i, bad in enumerate([b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80"]):
    put(f"utf8_{i}.txt", b"text " + bad + b" more")
    put(f"utf8_{i}.jsonl", b'{"text": "' + bad + b'"}\n')
for i, obj in enumerate([b"[1, 2]", b'"text"', b"null", b"123", b"true", b'{"text": 5}', b'{"text": null}',
                         b'{"text": ["a"]}', b"{}", b"\xef\xbb\xbf{\"text\": \"bom\"}", b"[" * 100000,
                         b'{"text": "a", "n": ' + b"9" * 5000 + b"}", b'{"text": "\\udfff x"}', b'{"text": "a"} x']):
    put(f"object{i}.jsonl", b'{"text": "fine"}\n' + obj + b"\n")
put("blank.jsonl", b"\n  \n\t\n")
put("empty.jsonl", b"")
put("space.txt", b" \n\n \t\n")
put("space_para.txt", b"\n\n\n", ["--paragraphs"])
os.makedirs(os.path.join(g, "adir"))
cases.append(("adir", [], os.path.join(g, "adir")))
os.mkfifo(os.path.join(g, "fifo"))
cases.append(("fifo", [], os.path.join(g, "fifo")))
good = os.path.join(g, "good.txt")
open(good, "w").write("some text\n")
for i, data in enumerate([bytes(rng.randrange(256) for _ in range(300)), b"", b"[]", b"{}", b'{"model": 1}']):
    path = os.path.join(g, f"tokenizer{i}.json")
    open(path, "wb").write(data)
    cases.append((f"tokenizer{i}.json", ["--tokenizer", path], good))
cases.append(("--out", ["--out", good], good))

bad = 0
for needle, args, path in cases:
    argv = ["prepare_data.py", "--out", os.path.join(g, "out")] + args + [path]
    if "--tokenizer" not in args:
        argv[3:3] = ["--train-tokenizer", "--vocab-size", "300"]
    out, err, code = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            sys.argv = argv
            prep.main()
            code = 0
        except SystemExit as e:
            code = e.code
        except BaseException:  # noqa: BLE001 - what would have been a traceback
            code = "traceback:\n" + traceback.format_exc()
    lines = err.getvalue().splitlines()  # progress lines (one per stage off a terminal), then the error
    errors = [line for line in lines if line.startswith("error: ")]
    if code != 2 or len(errors) != 1 or lines[-1] != errors[0] or needle not in errors[0]:
        bad += 1
        print(f"FAIL {' '.join(argv[1:])}: exit {code}, expected 2 and one 'error:' line naming {needle}; "
              f"stderr: {err.getvalue()[-600:]!r}")
print(f"{len(cases) - bad} of {len(cases)} garbage inputs: exit 2 and one error: line naming the file")
sys.exit(1 if bad else 0)
PY
check $? "garbage inputs (random bytes, truncated JSONL, invalid UTF-8, non-object lines, a directory, bad tokenizers)"
echo "$rows rows"
exit $fail
