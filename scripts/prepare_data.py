#!/usr/bin/env python3
"""Tokenise text or JSONL files into llm.c token shards for autosp-train (data.source "tokens").

  prepare_data.py --out DIR (--tokenizer tokenizer.json | --train-tokenizer --vocab-size N)
                  [--val-fraction 0.05] [--text-key text] [--paragraphs] [--shard-tokens N]
                  [--seed 0] [--overwrite] INPUT...

Documents: each line of a .jsonl file (its --text-key field), each other file as a whole (or, with
--paragraphs, each blank-line-separated paragraph of it); an input without a document is an error.
Each document is followed by the EOS token (the tokenizer's <|endoftext|>, <|end_of_text|>, </s> or
<eos>; a trained tokenizer gets <|endoftext|>), so no document runs into the next unmarked, and
begins with the BOS token where the tokenizer puts one before a text, as transformers' tokenizer(text)
does: tokenizer_config.json's add_bos_token with its bos_token where that file (beside tokenizer.json)
says, else what the tokenizer's post-processor adds in front (Llama 3's <|begin_of_text|>, Llama 2's
<s>; GPT-2's and a trained tokenizer add none). A BOS that is the EOS token itself is not repeated. Special-token text inside
a document ("<|endoftext|>" written out) is encoded as plain text, so EOS only ever ends a document.
A seeded shuffle of the documents puts --val-fraction of them (at least one when there are two or
more) into the validation split; the train split must keep at least one.

Writes DIR/train_000000.bin, ... and DIR/val_000000.bin, ...: llm.c shards (256 x int32 header;
magic 20240520 version 1 with uint16 tokens when the vocabulary fits in 16 bits, else magic
20240801 version 7 with uint32), DIR/tokenizer.json (the tokenizer used, for autosp-sample
--tokenizer) and DIR/data.json with what the run config needs (model.vocab_size, data.path,
data.val_path, the EOS and BOS ids). A DIR holding such files of an earlier run is refused unless --overwrite
is given, which first removes them all (other files in DIR are left alone), so no old shard is picked
up by the new run's train_*.bin. Runs under the venv of scripts/hf-venv.sh (Hugging Face `tokenizers`).
Bad input or usage is one `error:` line and exit 2; a failed write is one `error:` line and exit 3.
"""
import argparse
import glob
import json
import os
import random
import struct
import sys

EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
HEADER_INTS = 256
# What a run writes into --out: the shards (and their temporary names), tokenizer.json, data.json.
OUTPUTS = ("train_*.bin", "val_*.bin", "train_*.bin.tmp", "val_*.bin.tmp", "tokenizer.json", "data.json")


def fail(msg, code=2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def first_line(e):
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


class ArgParser(argparse.ArgumentParser):
    def error(self, message):  # a bad flag is one `error:` line and exit 2, like every other mistake
        fail(f"{message} (see --help)")


def jsonl_documents(path, text_key):
    docs = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                fail(f"{path}:{n}: not UTF-8 text (byte {e.start} of the line)")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not valid JSON ({e.msg})")
            except (ValueError, RecursionError) as e:  # a number over 4300 digits, nesting too deep
                fail(f"{path}:{n}: not usable JSON ({first_line(e)[:100]})")
            if not isinstance(obj, dict) or not isinstance(obj.get(text_key), str):
                fail(f"{path}:{n}: expected an object with a string field '{text_key}' (--text-key)")
            text = obj[text_key]
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:  # "\ud800" is valid JSON but no Unicode text
                fail(f"{path}:{n}: field '{text_key}' holds a lone surrogate (\\u{ord(text[e.start]):04x}), not text")
            docs.append((f"{path}:{n}", text))
    return docs


def text_documents(path, paragraphs):
    try:
        with open(path, encoding="utf-8", errors="strict") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 text (byte {e.start})")
    if not paragraphs:
        return [(f"{path}#0", text)] if text.strip() else []
    return [(f"{path}#{i}", p.strip("\n")) for i, p in enumerate(q for q in text.split("\n\n") if q.strip())]


def documents(paths, text_key, paragraphs):
    """(origin, text) for every document of the inputs, in order; each input must hold one."""
    docs = []
    for path in paths:
        if not os.path.isfile(path):
            fail(f"{path}: not a file")
        try:
            found = jsonl_documents(path, text_key) if path.endswith(".jsonl") else text_documents(path, paragraphs)
        except OSError as e:
            fail(f"{path}: cannot read ({e.strerror})")
        if not found:
            fail(f"{path}: holds no document (the file is empty or only blank lines)")
        docs += found
    return docs


def earlier_output(out, overwrite):
    """The files an earlier run left in --out (refused without --overwrite); --out must be a directory."""
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"--out {out}: exists and is not a directory")
    old = sorted({p for pat in OUTPUTS for p in glob.glob(os.path.join(glob.escape(out), pat))})
    if old and not overwrite:
        names = ", ".join(os.path.basename(p) for p in old[:3]) + (", ..." if len(old) > 3 else "")
        fail(f"--out {out}: holds the output of an earlier run ({names}); give --overwrite to replace it, "
             "or another --out")
    return old


def load_tokenizer(path):
    from tokenizers import Tokenizer
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        fail(f"{path}: no tokenizer.json there")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions for bad files
        fail(f"{path}: not a Hugging Face tokenizer.json ({first_line(e)})")


def tokenizer_config(path):
    """tokenizer_config.json beside the tokenizer (a dict), or None where there is none."""
    d = path if os.path.isdir(path) else os.path.dirname(path) or "."
    cfg_path = os.path.join(d, "tokenizer_config.json")
    if not os.path.isfile(cfg_path):
        return None
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        fail(f"{cfg_path}: not a readable tokenizer_config.json ({first_line(e)[:100]})")
    if not isinstance(cfg, dict):
        fail(f"{cfg_path}: expected a JSON object")
    return cfg_path, cfg


def bos_prefix(tok, path):
    """The ids the tokenizer puts before a text's own (normally [BOS] or []), as transformers'
    tokenizer(text) would: tokenizer_config.json's add_bos_token where it is set, else the
    post-processor's prefix."""
    found = tokenizer_config(path) if path else None
    if found and isinstance(found[1].get("add_bos_token"), bool):
        cfg_path, cfg = found
        if not cfg["add_bos_token"]:
            return []
        name = cfg.get("bos_token")
        name = name.get("content") if isinstance(name, dict) else name
        bos = tok.token_to_id(name) if isinstance(name, str) else None
        if bos is None:
            fail(f"{cfg_path}: add_bos_token is true but its bos_token {json.dumps(name)[:80]} is not in the tokenizer")
        return [bos]
    probe = "a"
    plain = tok.encode(probe, add_special_tokens=False).ids
    full = tok.encode(probe, add_special_tokens=True).ids
    for at in range(len(full) - len(plain) + 1):
        if full[at:at + len(plain)] == plain:
            return full[:at]
    return []


def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_NAMES[0]],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


class ShardWriter:
    """Tokens into DIR/<split>_NNNNNN.bin files of at most shard_tokens each."""

    def __init__(self, out, split, shard_tokens, wide):
        self.out, self.split, self.limit, self.wide = out, split, shard_tokens, wide
        self.buf, self.files, self.total = [], [], 0

    def add(self, ids):
        self.buf.extend(ids)
        while len(self.buf) >= self.limit:
            self._write(self.buf[:self.limit])
            self.buf = self.buf[self.limit:]

    def close(self):
        if self.buf or not self.files:
            self._write(self.buf)
        self.buf = []

    def _write(self, ids):
        import numpy as np
        path = os.path.join(self.out, f"{self.split}_{len(self.files):06d}.bin")
        header = np.zeros(HEADER_INTS, dtype="<i4")
        header[0], header[1] = (20240801, 7) if self.wide else (20240520, 1)
        header[2] = len(ids)
        with open(path + ".tmp", "wb") as f:
            f.write(header.tobytes())
            f.write(np.asarray(ids, dtype="<u4" if self.wide else "<u2").tobytes())
        os.replace(path + ".tmp", path)
        self.files.append(path)
        self.total += len(ids)


def main():
    ap = ArgParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="text or .jsonl files")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--tokenizer", help="a Hugging Face tokenizer.json (or a directory holding one)")
    ap.add_argument("--train-tokenizer", action="store_true", help="train a byte-level BPE on the inputs")
    ap.add_argument("--vocab-size", type=int, default=0, help="with --train-tokenizer: its vocabulary size")
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--text-key", default="text", help="the text field of .jsonl lines")
    ap.add_argument("--paragraphs", action="store_true", help="text files: one document per blank-line paragraph")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the shards, tokenizer.json and data.json of an earlier run in --out")
    a = ap.parse_args()

    if bool(a.tokenizer) == bool(a.train_tokenizer):
        fail("give one of --tokenizer FILE or --train-tokenizer --vocab-size N")
    if a.train_tokenizer and not 257 <= a.vocab_size <= 2**31 - 1:
        fail(f"--vocab-size {a.vocab_size}: a byte-level BPE needs at least 257 (256 bytes and <|endoftext|>)")
    if not 0 <= a.val_fraction < 1:
        fail(f"--val-fraction {a.val_fraction}: expected a number in [0, 1)")
    if a.shard_tokens < 1 or a.shard_tokens > 2**31 - 1:
        fail(f"--shard-tokens {a.shard_tokens}: expected 1 .. 2^31-1 (the header's count is an int32)")

    old = earlier_output(a.out, a.overwrite)

    docs = documents(a.inputs, a.text_key, a.paragraphs)
    order = list(range(len(docs)))
    random.Random(a.seed).shuffle(order)
    n_val = 0 if a.val_fraction == 0 or len(docs) < 2 else max(1, int(round(a.val_fraction * len(docs))))
    if n_val >= len(docs):
        fail(f"--val-fraction {a.val_fraction}: puts all {len(docs)} documents into the validation split, so the "
             "train split is empty; lower --val-fraction or give more documents")
    val_docs = set(order[:n_val])

    tok = train_tokenizer((t for _, t in docs), a.vocab_size) if a.train_tokenizer else load_tokenizer(a.tokenizer)
    eos = next((tok.token_to_id(n) for n in EOS_NAMES if tok.token_to_id(n) is not None), None)
    if eos is None:
        fail(f"the tokenizer has no EOS token (none of {', '.join(EOS_NAMES)})")
    bos = [t for t in bos_prefix(tok, a.tokenizer) if t != eos]
    vocab = tok.get_vocab_size(with_added_tokens=True)
    wide = vocab > 2**16
    if not hasattr(tok, "encode_special_tokens"):
        fail("the installed `tokenizers` is older than 0.14 (no encode_special_tokens); run scripts/hf-venv.sh")
    tok.encode_special_tokens = True  # "<|endoftext|>" inside a document is text, not a document end
    tok_name = a.tokenizer or "the trained tokenizer"

    try:
        for p in old:  # --overwrite: nothing of the earlier run may match the new train_*.bin / val_*.bin
            os.remove(p)
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        fail(f"--out {a.out}: cannot prepare it ({e})")
    try:
        writers = {s: ShardWriter(a.out, s, a.shard_tokens, wide) for s in ("train", "val")}
        chunk = 1024
        for start in range(0, len(docs), chunk):
            batch = docs[start:start + chunk]
            try:
                encs = tok.encode_batch([t for _, t in batch], add_special_tokens=False)
            except Exception:  # noqa: BLE001 - find the document and say why
                for origin, t in batch:
                    try:
                        tok.encode(t, add_special_tokens=False)
                    except Exception as e:  # noqa: BLE001
                        fail(f"{tok_name}: cannot encode {origin} ({first_line(e)})")
                raise
            for i, enc in enumerate(encs):
                writers["val" if start + i in val_docs else "train"].add(bos + enc.ids + [eos])
        writers["train"].close()
        if n_val:
            writers["val"].close()
        tok.encode_special_tokens = False  # the saved tokenizer.json stays as it was given
        tok.save(os.path.join(a.out, "tokenizer.json"))
        info = {"model": {"vocab_size": vocab},
                "data": {"source": "tokens", "path": os.path.join(a.out, "train_*.bin"),
                         "val_path": os.path.join(a.out, "val_*.bin") if n_val else ""},
                "eos_token_id": eos, "bos_token_id": bos[0] if len(bos) == 1 else (bos or None), "documents": {"train": len(docs) - n_val, "val": n_val},
                "tokens": {"train": writers["train"].total, "val": writers["val"].total},
                "token_dtype": "uint32" if wide else "uint16"}
        with open(os.path.join(a.out, "data.json"), "w") as f:
            json.dump(info, f, indent=1)
    except OSError as e:
        fail(f"--out {a.out}: write failed ({e})", code=3)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
