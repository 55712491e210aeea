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

Supervised fine-tuning (--chat or --completion, with --seq-len S and --tokenizer a model directory):
  --chat        .jsonl rows {"messages": [{"role": ..., "content": "..."}, ...]} (the OpenAI / TRL
                conversational format; roles system, user, assistant, tool). Each conversation is
                rendered with the directory's chat template (tokenizer_config.json "chat_template",
                by transformers' apply_chat_template, which renders with jinja2) and tokenized as
                transformers does (no special tokens added: the template writes them). The mask is 1
                on the assistant's tokens and 0 elsewhere. An assistant turn is found by rendering:
                the turn's text is what rendering messages[:i + 1] adds to messages[:i] rendered with
                add_generation_prompt=True, less trailing whitespace (the template's separator after
                the turn), and a token is the assistant's when its characters overlap that text (the
                rule of return_assistant_tokens_mask on a template with {% generation %} markers, but
                needing no markers). A template that renders a prefix of a conversation as anything but
                a prefix of the whole is an error naming the line. A train split without any assistant
                turn is an error (no target), before anything is written; a validation split without
                one, a warning.
  --completion  .jsonl rows {"prompt": "...", "completion": "..."}: BOS (as for documents) + the text of
                prompt + completion, masked 1 on the completion's tokens and on the EOS after it.
Each example ends with the EOS (the --chat EOS is masked 0, unless the template wrote it inside an
assistant turn; it is not added again when the template's last token is already EOS). Examples are
packed whole into windows of S tokens, which is where autosp-train's data.seq_len S reads them: one
that does not fit in what is left of a window starts the next one, and the rest of the window is EOS
padding (mask 0; under data.document_mask each pad is an empty document). An example longer than S
is cut at window boundaries into consecutive windows (--long split, the default: the mask stays
per token; each piece after the first starts a window without the context before it) or left out
(--long drop); data.json counts both. The stream ends with one EOS so its last window has its last
target. Beside each shard <split>_NNNNNN.bin is <split>_NNNNNN.npy, the one-dimensional uint8 mask
of its tokens (data.loss_mask_path / data.val_loss_mask_path), and docs_<split>_NNNNNN.npy, one
int32 per token: k + 1 on example k's tokens (its EOS included), 0 on padding (data.doc_ids_path /
data.val_doc_ids_path). Under data.document_mask the document ids, not the EOS tokens, delimit the
documents, so a chat template that ends each turn with EOS (Llama 2, Mistral, Zephyr) leaves a
conversation one document. data.json names them with seq_len, eos_token_id and document_mask: true.

Preference pairs (--preference, with --seq-len S and --tokenizer a model directory), for DPO:
  .jsonl rows in TRL's preference format: {"prompt", "chosen", "rejected"} as strings, or as message
  lists (conversational: the prompt's messages, and the chosen and rejected answers' messages,
  rendered with the directory's chat template as --chat does; without "prompt", the longest common
  leading run of messages of chosen and rejected is the prompt, TRL's implicit prompt). Each pair
  gives two sequences, as TRL's DPOTrainer tokenizes them for a decoder-only model: prompt tokens +
  completion tokens + EOS (not added again where the completion ends with it), prompt and completion
  tokenized apart, no special tokens added (no BOS: TRL adds none; a chat template writes its own),
  the mask 1 on the completion's tokens and its EOS. Conversational rows render the prompt with the
  generation prompt and prompt + answer without it; the answer is what the latter adds to the former.
  Both sequences of a pair go whole into one window, the chosen one first (so they are in one
  micro-batch: data.document_mask keeps them apart); a pair longer than S is left out (counted in
  data.json; --long split does not apply). Beside each shard <split>_NNNNNN.bin and its mask is
  pairs_<split>_NNNNNN.npy, one int32 per token: k + 1 on the tokens of pair k's chosen sequence,
  -(k + 1) on its rejected one, 0 on padding (k counts the split's pairs from 0). data.json names
  them (pairs_path, val_pairs_path). A row without prompt (string form), chosen or rejected, a value
  of the wrong type, an empty completion, or a prompt that renders differently before chosen than
  before rejected is an error naming the line.
"""
import argparse
import glob
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import time

EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
HEADER_INTS = 256
# What a run writes into --out: the shards (and their temporary names), tokenizer.json, data.json.
OUTPUTS = ("train_*.bin", "val_*.bin", "train_*.bin.tmp", "val_*.bin.tmp", "train_*.npy", "val_*.npy",
           "train_*.npy.tmp", "val_*.npy.tmp", "pairs_train_*.npy", "pairs_val_*.npy", "pairs_train_*.npy.tmp",
           "pairs_val_*.npy.tmp", "docs_train_*.npy", "docs_val_*.npy", "docs_train_*.npy.tmp", "docs_val_*.npy.tmp",
           "tokenizer.json", "data.json")
ROLES = ("system", "user", "assistant", "tool")


def fail(msg, code=2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def first_line(e):
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


class ArgParser(argparse.ArgumentParser):
    def error(self, message):  # a bad flag is one `error:` line and exit 2, like every other mistake
        fail(f"{message} (see --help)")


def jsonl_documents(path, text_key):
    return jsonl_rows(path, lambda obj, where: text_row(obj, where, text_key))


def text_row(obj, where, text_key):
    if not isinstance(obj, dict) or not isinstance(obj.get(text_key), str):
        fail(f"{where}: expected an object with a string field '{text_key}' (--text-key)")
    return checked_text(obj[text_key], where, f"field '{text_key}'")


def checked_text(text, where, what):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # "\ud800" is valid JSON but no Unicode text
        fail(f"{where}: {what} holds a lone surrogate (\\u{ord(text[e.start]):04x}), not text")
    return text


def chat_row(obj, where):
    """--chat: the row's messages, checked: a non-empty list of {role, content} with a known role and
    string content."""
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list) or not obj["messages"]:
        fail(f"{where}: expected an object with a non-empty list 'messages' of {{role, content}} (--chat)")
    return checked_messages(obj["messages"], where, "messages")


def checked_messages(messages, where, key):
    """A list of {role, content} messages, each with a known role and string content."""
    out = []
    for i, m in enumerate(messages):
        at = f"{where}: {key}[{i}]"
        if not isinstance(m, dict):
            fail(f"{at}: expected an object {{role, content}}, got {json.dumps(m)[:60]}")
        if "role" not in m:
            fail(f"{at}: no 'role'")
        if m["role"] not in ROLES:
            fail(f"{at}: unknown role {json.dumps(m['role'])[:60]} (expected one of {', '.join(ROLES)})")
        if not isinstance(m.get("content"), str):
            fail(f"{at}: 'content' must be a string, got {json.dumps(m.get('content'))[:60]}")
        out.append({"role": m["role"], "content": checked_text(m["content"], at, "'content'")})
    return out


def check_assistant_turns(inputs, docs, val_docs):
    """--chat learns only the assistant's turns: a train split without one would be data with no target
    at all, refused before anything is written (exit 2); a validation split without one, a warning
    (its validation would report no loss)."""
    def turns(split):
        rows = [row for i, (_, row) in enumerate(docs) if (i in val_docs) == (split == "val")]
        return len(rows), sum(any(m["role"] == "assistant" for m in row) for row in rows)
    n, with_turn = turns("train")
    if with_turn == 0:
        fail(f"{', '.join(inputs)}: no conversation of the train split ({n}) has an assistant turn: --chat learns "
             "only the assistant's tokens, so the data would hold no target (give conversations with "
             "{\"role\": \"assistant\"} turns, or prepare plain text without --chat)")
    n, with_turn = turns("val")
    if n and with_turn == 0:
        print(f"warning: no conversation of the validation split ({n}) has an assistant turn: its validation would "
              "have no target (no loss to report)", file=sys.stderr)


def completion_row(obj, where):
    """--completion: (prompt, completion), both strings."""
    if not isinstance(obj, dict):
        fail(f"{where}: expected an object {{prompt, completion}} (--completion)")
    for key in ("prompt", "completion"):
        if not isinstance(obj.get(key), str):
            fail(f"{where}: '{key}' must be a string, got {json.dumps(obj.get(key))[:60]} (--completion)")
    return checked_text(obj["prompt"], where, "'prompt'"), checked_text(obj["completion"], where, "'completion'")


def preference_row(obj, where):
    """--preference: ("text", prompt, chosen, rejected) of strings, or ("chat", prompt, chosen, rejected)
    of message lists (checked as --chat checks them; an implicit prompt is taken from chosen and
    rejected here)."""
    if not isinstance(obj, dict):
        fail(f"{where}: expected an object {{prompt, chosen, rejected}} (--preference)")
    for key in ("chosen", "rejected"):
        if key not in obj:
            fail(f"{where}: no '{key}' (--preference reads TRL's {{prompt, chosen, rejected}})")
    if all(isinstance(obj.get(k), str) for k in ("chosen", "rejected")):
        if not isinstance(obj.get("prompt"), str):
            fail(f"{where}: 'prompt' must be a string like 'chosen' and 'rejected', got "
                 f"{json.dumps(obj.get('prompt'))[:60]} (--preference)")
        return ("text",) + tuple(checked_text(obj[k], where, f"'{k}'") for k in ("prompt", "chosen", "rejected"))
    if not all(isinstance(obj.get(k), list) for k in ("chosen", "rejected")) or \
            ("prompt" in obj and not isinstance(obj["prompt"], list)):
        fail(f"{where}: 'prompt', 'chosen' and 'rejected' must all be strings or all lists of messages "
             f"(--preference)")
    chosen, rejected = (checked_messages(obj[k], where, k) for k in ("chosen", "rejected"))
    if "prompt" in obj:
        prompt = checked_messages(obj["prompt"], where, "prompt")
    else:
        n = 0  # TRL's implicit prompt: the messages chosen and rejected share from the start
        while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
            n += 1
        if n == 0:
            fail(f"{where}: no 'prompt', and 'chosen' and 'rejected' share no leading message to take as the prompt "
                 f"(--preference)")
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    for key, answer in (("chosen", chosen), ("rejected", rejected)):
        if not any(m["content"] for m in answer):
            fail(f"{where}: '{key}' is an empty completion (no message with content), so it has no log-probability "
                 f"to compare")
    return "chat", prompt, chosen, rejected


def jsonl_rows(path, parse):
    """(origin, parse(obj, origin)) for every non-blank line of a .jsonl file."""
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
            docs.append((f"{path}:{n}", parse(obj, f"{path}:{n}")))
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


def documents(paths, text_key, paragraphs, mode=None):
    """(origin, text) for every document of the inputs, in order; each input must hold one. With mode
    "chat", "completion" or "preference" (only .jsonl inputs) the rows' messages, (prompt, completion) or
    preference pairs instead."""
    docs = []
    for path in paths:
        if not os.path.isfile(path):
            fail(f"{path}: not a file")
        if mode and not path.endswith(".jsonl"):
            fail(f"{path}: --{mode} reads .jsonl files")
        try:
            if mode:
                found = jsonl_rows(path, {"chat": chat_row, "completion": completion_row,
                                          "preference": preference_row}[mode])
            else:
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
    """Tokens into DIR/<split>_NNNNNN.bin files of at most shard_tokens each; with masks, each
    shard's loss mask beside it in DIR/<split>_NNNNNN.npy (uint8, one dimension, the same length);
    with ids ("pairs" or "docs"), each shard's pair ids or document ids in
    DIR/<ids>_<split>_NNNNNN.npy (int32, the same length)."""

    def __init__(self, out, split, shard_tokens, wide, masks=False, ids=None):
        self.out, self.split, self.limit, self.wide = out, split, shard_tokens, wide
        self.buf, self.mbuf, self.pbuf, self.files, self.total, self.targets = [], [], [], [], 0, 0
        self.masks, self.pairs = masks, ids

    def add(self, ids, mask=None, pair=0):
        self.buf.extend(ids)
        if self.masks:
            self.mbuf.extend(mask)
            self.targets += sum(mask)
        if self.pairs:
            self.pbuf.extend([pair] * len(ids))
        while len(self.buf) >= self.limit:
            self._write(self.buf[:self.limit], self.mbuf[:self.limit], self.pbuf[:self.limit])
            self.buf, self.mbuf, self.pbuf = self.buf[self.limit:], self.mbuf[self.limit:], self.pbuf[self.limit:]

    def close(self):
        if self.buf or not self.files:
            self._write(self.buf, self.mbuf, self.pbuf)
        self.buf, self.mbuf, self.pbuf = [], [], []

    @staticmethod
    def _save_npy(path, array):
        import numpy as np
        with open(path + ".tmp", "wb") as f:
            np.save(f, array)
        os.replace(path + ".tmp", path)

    def _write(self, ids, mask, pair):
        import numpy as np
        path = os.path.join(self.out, f"{self.split}_{len(self.files):06d}.bin")
        header = np.zeros(HEADER_INTS, dtype="<i4")
        header[0], header[1] = (20240801, 7) if self.wide else (20240520, 1)
        header[2] = len(ids)
        with open(path + ".tmp", "wb") as f:
            f.write(header.tobytes())
            f.write(np.asarray(ids, dtype="<u4" if self.wide else "<u2").tobytes())
        if self.masks:
            self._save_npy(path[:-len(".bin")] + ".npy", np.asarray(mask, dtype=np.uint8))
        if self.pairs:
            name = os.path.basename(path)[:-len(".bin")]
            self._save_npy(os.path.join(self.out, f"{self.pairs}_{name}.npy"), np.asarray(pair, dtype="<i4"))
        os.replace(path + ".tmp", path)
        self.files.append(path)
        self.total += len(ids)


# ---- supervised fine-tuning: chat and completion examples with loss masks ----

def load_hf_tokenizer(path, mode):
    """transformers' (fast) tokenizer of a model directory, read offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        fail(f"--{mode} needs transformers: run under the venv of scripts/hf-venv.sh")
    if not os.path.isdir(path):
        fail(f"--tokenizer {path}: --{mode} needs a model directory (tokenizer.json, tokenizer_config.json)")
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)  # 4.44's clean_up_tokenization_spaces notice
    try:
        hf = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any failure to load is the input's
        fail(f"--tokenizer {path}: transformers cannot load its tokenizer ({first_line(e)})")
    if not hf.is_fast:
        fail(f"--tokenizer {path}: not a fast tokenizer (tokenizer.json), which --{mode} needs for token offsets")
    if mode == "chat" and not hf.chat_template:
        fail(f"--tokenizer {path}: its tokenizer_config.json has no chat_template (--chat renders with the model's own)")
    return hf


def render(hf, messages, generation_prompt, where):
    try:
        return hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as e:  # noqa: BLE001 - jinja2's TemplateError, the template's raise_exception
        fail(f"{where}: the chat template cannot render this conversation ({first_line(e)})")


def overlap_mask(offsets, spans):
    """1 for each token whose characters [s, e) overlap one of `spans` (a zero-width token at s counts
    as [s, s + 1)), else 0."""
    return [int(any(s < b and max(e, s + 1) > a for a, b in spans)) for s, e in offsets]


def chat_example(hf, messages, eos, where):
    """(ids, mask) of one conversation: its rendering tokenized as apply_chat_template does, the mask 1
    on the assistant turns (see the module's help), then EOS (mask 0) unless the rendering ends with it."""
    full = render(hf, messages, False, where)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(hf, messages[:i], True, where)
        upto = render(hf, messages[:i + 1], False, where)
        if not (upto.startswith(before) and full.startswith(upto)):
            fail(f"{where}: the chat template renders messages[:{i}] (with the generation prompt) or "
                 f"messages[:{i + 1}] as other than a prefix of the whole conversation, so the assistant's "
                 f"turn {i} cannot be found")
        end = len(upto.rstrip())
        if end > len(before):
            spans.append((len(before), end))
    enc = hf(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, mask = list(enc["input_ids"]), overlap_mask(enc["offset_mapping"], spans)
    if not ids or ids[-1] != eos:
        ids.append(eos)
        mask.append(0)
    return ids, mask


def completion_example(hf, bos, prompt, completion, eos):
    """(ids, mask) of one prompt-completion row: BOS + tokens of prompt + completion + EOS, the mask 1
    on the tokens overlapping the completion and on the EOS."""
    text = prompt + completion
    enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = overlap_mask(enc["offset_mapping"], [(len(prompt), len(text))])
    return bos + list(enc["input_ids"]) + [eos], [0] * len(bos) + mask + [1]


def preference_example(hf, row, eos, where):
    """[(ids, mask), (ids, mask)]: the chosen and the rejected sequence of one pair (see the module's
    help): prompt tokens + completion tokens + EOS, the mask 1 on the completion and its EOS."""
    form, prompt, chosen, rejected = row
    if form == "chat":
        if not hf.chat_template:
            fail(f"{where}: conversational pair, but the tokenizer's tokenizer_config.json has no chat_template")
        text = render(hf, prompt, True, where)
        answers = []
        for key, answer in (("chosen", chosen), ("rejected", rejected)):
            whole = render(hf, prompt + answer, False, where)
            if not whole.startswith(text):
                fail(f"{where}: the prompt renders differently before '{key}' than alone with the generation "
                     f"prompt, so the pair has no common prompt (the chat template rewrites it by what follows)")
            answers.append(whole[len(text):])
        chosen, rejected, prompt = answers[0], answers[1], text
    p_ids = list(hf(prompt, add_special_tokens=False)["input_ids"])
    seqs = []
    for key, completion in (("chosen", chosen), ("rejected", rejected)):
        c_ids = list(hf(completion, add_special_tokens=False)["input_ids"])
        if not c_ids:
            fail(f"{where}: '{key}' is an empty completion (no token), so it has no log-probability to compare")
        if c_ids[-1] != eos:
            c_ids.append(eos)
        seqs.append((p_ids + c_ids, [0] * len(p_ids) + [1] * len(c_ids)))
    return seqs


class Packer:
    """Examples into windows of seq_len tokens (see the module's help): whole where they fit, after
    EOS padding (mask 0) of the rest of the window where they do not; longer ones cut into windows
    (long "split") or left out ("drop"). finish() completes the last window and adds the final EOS."""

    def __init__(self, writer, seq_len, eos, long):
        self.w, self.S, self.eos, self.long = writer, seq_len, eos, long
        self.used, self.examples, self.split, self.dropped = 0, 0, 0, 0

    def pad(self):
        if self.used:
            n = self.S - self.used
            self.w.add([self.eos] * n, [0] * n)
            self.used = 0

    def add(self, ids, mask):
        if len(ids) > self.S:
            if self.long == "drop":
                self.dropped += 1
                return
            self.split += 1
        if self.used + len(ids) > self.S:
            self.pad()
        self.w.add(ids, mask, self.examples + 1)  # its document id: an EOS inside it does not end it
        self.used = (self.used + len(ids)) % self.S
        self.examples += 1

    def add_pair(self, seqs):
        """A preference pair: both sequences whole in one window, or left out when longer than it."""
        if sum(len(ids) for ids, _ in seqs) > self.S:
            self.dropped += 1
            return
        if self.used + sum(len(ids) for ids, _ in seqs) > self.S:
            self.pad()
        for sign, (ids, mask) in zip((1, -1), seqs):
            self.w.add(ids, mask, sign * (self.examples + 1))
            self.used = (self.used + len(ids)) % self.S
        self.examples += 1

    def finish(self):
        if self.examples:
            self.pad()
            self.w.add([self.eos], [0])


class Progress:
    """Progress of a stage on stderr: on a terminal one line redrawn (items done, rate, ETA), else a
    line when the stage starts and one when it ends (logs hold no carriage returns), as autosp-eval."""

    def __init__(self, stage, total, unit):
        self.stage, self.total, self.unit = stage, total, unit
        self.tty = sys.stderr.isatty()
        self.t0 = self.last = time.monotonic()
        self.done = 0
        if not self.tty:
            print(f"{stage}: {total} {unit}", file=sys.stderr, flush=True)

    @staticmethod
    def clock(s):
        s = int(s + 0.5)
        return f"{s // 3600}:{s // 60 % 60:02}:{s % 60:02}" if s >= 3600 else f"{s // 60}:{s % 60:02}"

    def update(self, done):
        self.done = done
        now = time.monotonic()
        if not self.tty or (now - self.last < 0.1 and done < self.total):
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        eta = self.clock((self.total - done) / rate) if rate > 0 else "?"
        print(f"\r\033[K{self.stage}: {done}/{self.total} {self.unit}, {rate:.1f} {self.unit}/s, ETA {eta}",
              end="", file=sys.stderr, flush=True)

    def finish(self):
        secs = time.monotonic() - self.t0
        print(f"{chr(13) + chr(27) + '[K' if self.tty else ''}{self.stage}: {self.done}/{self.total} {self.unit} "
              f"in {self.clock(secs)} ({self.done / max(secs, 1e-9):.1f} {self.unit}/s)", file=sys.stderr, flush=True)


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
    ap.add_argument("--chat", action="store_true", help="JSONL conversations {messages: [{role, content}]}, "
                    "rendered with the model's chat template, masked to the assistant's tokens")
    ap.add_argument("--completion", action="store_true", help="JSONL rows {prompt, completion}, masked to the "
                    "completion")
    ap.add_argument("--preference", action="store_true", help="JSONL preference pairs {prompt, chosen, rejected} "
                    "(TRL's format, strings or message lists), for DPO: both sequences of a pair in one window, "
                    "masked to the completions, with their pair ids")
    ap.add_argument("--seq-len", type=int, default=0,
                    help="with --chat / --completion / --preference: the window (data.seq_len)")
    ap.add_argument("--long", choices=("split", "drop"), default=None,
                    help="with --chat / --completion: an example longer than --seq-len is cut into windows "
                    "(split, the default) or left out (drop); --preference always drops such a pair")
    a = ap.parse_args()
    modes = [m for m in ("chat", "completion", "preference") if getattr(a, m)]
    if len(modes) > 1:
        fail(f"{' and '.join('--' + m for m in modes)} exclude each other")
    mode = modes[0] if modes else None
    if mode == "preference" and a.long == "split":
        fail("--long split: a preference pair is never cut (its two sequences must share one window); a pair "
             "longer than --seq-len is left out")
    if mode:
        if not a.tokenizer:
            fail(f"--{mode} needs --tokenizer DIR: a model directory with its tokenizer (and, for --chat, its "
                 "chat template)")
        if not 2 <= a.seq_len <= 2**26:
            fail(f"--seq-len {a.seq_len}: --{mode} packs examples into windows of data.seq_len tokens; give 2 .. 2^26")
    elif a.seq_len or a.long:
        fail("--seq-len and --long apply to --chat, --completion and --preference")

    if bool(a.tokenizer) == bool(a.train_tokenizer):
        fail("give one of --tokenizer FILE or --train-tokenizer --vocab-size N")
    if a.train_tokenizer and not 257 <= a.vocab_size <= 2**31 - 1:
        fail(f"--vocab-size {a.vocab_size}: a byte-level BPE needs at least 257 (256 bytes and <|endoftext|>)")
    if not 0 <= a.val_fraction < 1:
        fail(f"--val-fraction {a.val_fraction}: expected a number in [0, 1)")
    if a.shard_tokens < 1 or a.shard_tokens > 2**31 - 1:
        fail(f"--shard-tokens {a.shard_tokens}: expected 1 .. 2^31-1 (the header's count is an int32)")

    old = earlier_output(a.out, a.overwrite)

    docs = documents(a.inputs, a.text_key, a.paragraphs, mode)
    order = list(range(len(docs)))
    random.Random(a.seed).shuffle(order)
    n_val = 0 if a.val_fraction == 0 or len(docs) < 2 else max(1, int(round(a.val_fraction * len(docs))))
    if n_val >= len(docs):
        fail(f"--val-fraction {a.val_fraction}: puts all {len(docs)} documents into the validation split, so the "
             "train split is empty; lower --val-fraction or give more documents")
    val_docs = set(order[:n_val])
    if mode == "chat":
        check_assistant_turns(a.inputs, docs, val_docs)

    if a.train_tokenizer:
        print(f"training a byte-level BPE of {a.vocab_size} tokens on {len(docs)} documents", file=sys.stderr, flush=True)
    tok = train_tokenizer((t for _, t in docs), a.vocab_size) if a.train_tokenizer else load_tokenizer(a.tokenizer)
    hf = load_hf_tokenizer(a.tokenizer, mode) if mode else None
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

    # The new files are written into a staging folder inside --out and moved into place only when
    # every one is written: a refusal or a failed write part-way leaves the earlier run's files as
    # they were (and no half-written new ones).
    try:
        os.makedirs(a.out, exist_ok=True)
        a.stage = tempfile.mkdtemp(prefix=".prepare_data-", dir=a.out)
    except OSError as e:
        fail(f"--out {a.out}: cannot prepare it ({e})")
    try:
        if mode:
            info = write_examples(a, mode, docs, val_docs, n_val, tok, hf, eos, bos, vocab, wide)
        else:
            info = write_documents(a, docs, val_docs, n_val, tok, tok_name, eos, bos, vocab, wide)
        save_outputs(a, tok, info)
        publish(a, old)
    finally:
        shutil.rmtree(a.stage, ignore_errors=True)
    print(json.dumps(info))


def publish(a, old):
    """The staged files into --out: the earlier run's files removed (--overwrite: nothing of it may
    match the new train_*.bin / val_*.bin), then each new file moved in."""
    try:
        for p in old:
            os.remove(p)
        for name in sorted(os.listdir(a.stage)):
            os.replace(os.path.join(a.stage, name), os.path.join(a.out, name))
    except OSError as e:
        fail(f"--out {a.out}: cannot move the new files into place ({e})", code=3)


def write_documents(a, docs, val_docs, n_val, tok, tok_name, eos, bos, vocab, wide):
    """Plain text: each document tokenized, with BOS and EOS, into train / val shards; data.json's
    content."""
    try:
        writers = {s: ShardWriter(a.stage, s, a.shard_tokens, wide) for s in ("train", "val")}
        chunk = 1024
        progress = Progress("tokenizing", len(docs), "documents")
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
            progress.update(start + len(batch))
        progress.finish()
        writers["train"].close()
        if n_val:
            writers["val"].close()
    except OSError as e:
        fail(f"--out {a.out}: write failed ({e})", code=3)
    info = {"model": {"vocab_size": vocab},
            "data": {"source": "tokens", "path": os.path.join(a.out, "train_*.bin"),
                     "val_path": os.path.join(a.out, "val_*.bin") if n_val else ""},
            "eos_token_id": eos, "bos_token_id": bos[0] if len(bos) == 1 else (bos or None), "documents": {"train": len(docs) - n_val, "val": n_val},
            "tokens": {"train": writers["train"].total, "val": writers["val"].total},
            "token_dtype": "uint32" if wide else "uint16"}
    return info


def save_outputs(a, tok, info):
    """tokenizer.json (as it was given) and data.json into the staging folder."""
    try:
        tok.encode_special_tokens = False
        tok.save(os.path.join(a.stage, "tokenizer.json"))
        with open(os.path.join(a.stage, "data.json"), "w") as f:
            json.dump(info, f, indent=1)
    except OSError as e:
        fail(f"--out {a.out}: write failed ({e})", code=3)


def write_examples(a, mode, docs, val_docs, n_val, tok, hf, eos, bos, vocab, wide):
    """--chat / --completion / --preference: the examples packed into windows, shards with their masks;
    data.json's content."""
    pairs = mode == "preference"
    try:
        writers = {s: ShardWriter(a.stage, s, a.shard_tokens, wide, masks=True, ids="pairs" if pairs else "docs")
                   for s in ("train", "val")}
        packers = {s: Packer(writers[s], a.seq_len, eos, a.long or ("drop" if pairs else "split")) for s in writers}
        progress = Progress(f"rendering ({mode})", len(docs), "examples")
        for i, (origin, row) in enumerate(docs):
            progress.update(i)
            if mode == "chat":
                seqs = [chat_example(hf, row, eos, origin)]
            elif mode == "completion":
                seqs = [completion_example(hf, bos, row[0], row[1], eos)]
            else:
                seqs = preference_example(hf, row, eos, origin)
            top = max(max(ids) for ids, _ in seqs)
            if top >= vocab:
                fail(f"{origin}: token id {top} is outside the tokenizer's vocabulary of {vocab}")
            packer = packers["val" if i in val_docs else "train"]
            packer.add_pair(seqs) if pairs else packer.add(*seqs[0])
        progress.update(len(docs))
        progress.finish()
        if not packers["train"].examples:
            what = "pair (both sequences together)" if pairs else "example"
            fail(f"every train {what} is longer than --seq-len {a.seq_len} and --long drop left all out")
        for s in ("train", "val"):
            packers[s].finish()
            if s == "train" or packers[s].examples:
                writers[s].close()
    except OSError as e:
        fail(f"--out {a.out}: write failed ({e})", code=3)
    has_val = n_val and packers["val"].examples > 0
    total = writers["train"].total + writers["val"].total
    for s in ("train", "val"):  # assistant turns that the template renders as nothing
        turns = mode == "chat" and any(any(m["role"] == "assistant" for m in row) for i, (_, row) in enumerate(docs)
                                       if (i in val_docs) == (s == "val"))
        if (s == "train" or has_val) and writers[s].targets == 0 and turns:
            print(f"warning: the {s} split has no target (0 of {writers[s].total} tokens): the chat template "
                  "rendered its assistant turns as nothing", file=sys.stderr)
    info = {"model": {"vocab_size": vocab},
            "data": {"source": "tokens", "path": os.path.join(a.out, "train_*.bin"),
                     "loss_mask_path": os.path.join(a.out, "train_*.npy"),
                     "val_path": os.path.join(a.out, "val_*.bin") if has_val else "",
                     "val_loss_mask_path": os.path.join(a.out, "val_*.npy") if has_val else "",
                     **({} if pairs else {"doc_ids_path": os.path.join(a.out, "docs_train_*.npy"),
                                          "val_doc_ids_path": os.path.join(a.out, "docs_val_*.npy") if has_val else ""}),
                     "seq_len": a.seq_len, "eos_token_id": eos, "document_mask": True},
            "eos_token_id": eos, "bos_token_id": bos[0] if len(bos) == 1 else (bos or None),
            "mode": mode,
            **({"pairs_path": os.path.join(a.out, "pairs_train_*.npy"),
                "val_pairs_path": os.path.join(a.out, "pairs_val_*.npy") if has_val else ""} if pairs else {}),
            "examples": {s: packers[s].examples for s in ("train", "val")},
            "longer_than_seq_len": {"split": packers["train"].split + packers["val"].split,
                                    "dropped": packers["train"].dropped + packers["val"].dropped},
            "tokens": {s: writers[s].total for s in ("train", "val")},
            "targets": {s: writers[s].targets for s in ("train", "val")},
            "target_fraction": round((writers["train"].targets + writers["val"].targets) / max(1, total), 6),
            "token_dtype": "uint32" if wide else "uint16"}
    return info


if __name__ == "__main__":
    main()
