#!/usr/bin/python3
"""Independent PyTorch reference for autosp's models: logits, loss and (optionally) gradients.

  /usr/bin/python3 tests/ref/model_ref.py --config CFG.json --weights W.safetensors \
      --batch IN.safetensors --dtype float32|float64 --out OUT.safetensors [--grads]

CFG.json   an autosp config; only its "model" object is read (a file holding just the model object,
           i.e. with "arch" at the top level, is accepted too).
W          Hugging Face names and layouts (float32/float64/bf16/f16; cast to --dtype). GPT-2 names may
           lack the "transformer." prefix; "*.attn.bias" / "*.attn.masked_bias" buffers are ignored.
IN         input_ids, labels, position_ids: I64 [B, S]; labels may hold -100 (ignored). Labels are
           already shifted (label[t] = token[t+1]); nothing is shifted here.
OUT        logits [B,S,V], loss [], loss_sum [] (in --dtype), valid_count [] (I64); with --grads
           also "grad.<name>" for every weight, under the name used in W (tied weights: one gradient).
--eos ID   packed documents, built here by hand from input_ids (position_ids in IN are ignored): a
           document ends with its EOS; attention is causal inside each document (an explicit
           block-diagonal mask), positions restart at 0 per document, and an EOS's target is
           ignored. OUT then also holds the position_ids and labels used.
--loss-mask  IN also holds loss_mask [B, S + 1]: the mask of the window's S + 1 tokens (input_ids
           then the last label). Applied the way Hugging Face does: labels over the unshifted
           window, -100 where the mask is 0, then shifted by one (the model's shift), so mask[t] = 0
           removes the target token t. Before --eos. OUT then also holds the labels used.

loss = loss_sum / valid_count = F.cross_entropy(ignore_index=-100, reduction="mean"), plus
router_aux_loss_coef × torch_models.load_balancing_loss when the model has output_router_logits.
Threads: torch.set_num_threads($OMP_NUM_THREADS) when that is set.
Exit codes: 0 ok; 2 bad usage/config/input (one "error: ..." line on stderr).
"""
import argparse
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402

import safetensors_io as st  # noqa: E402
import torch_models as tm  # noqa: E402


class RefError(Exception):
    pass


DTYPES = {"float32": torch.float32, "float64": torch.float64}
GPT2_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def warn(msg):
    print(f"warning: {msg}", file=sys.stderr)


def load_config(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise RefError(f"{path}: cannot read config ({e.strerror})")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RefError(f"{path}: config is not valid JSON ({e})")
    if isinstance(doc, dict) and "model" in doc:
        model = doc["model"]
    elif isinstance(doc, dict) and "arch" in doc:
        model = doc
    else:
        raise RefError(f"{path}: config has no \"model\" object")
    try:
        return tm.ModelConfig(model, warn=warn)
    except tm.ConfigError as e:
        raise RefError(f"{path}: {e}")


def map_weight_names(cfg, names, path):
    """Returns dict canonical name -> name in the file. Raises RefError for missing/duplicate weights."""
    shapes = tm.param_shapes(cfg)
    canon_to_file = {}
    for name in names:
        if cfg.arch == "gpt2":
            if name.endswith(GPT2_BUFFER_SUFFIXES):
                continue
            canon = name if name.startswith("transformer.") else "transformer." + name
            if name == "lm_head.weight":
                warn(f"{path}: lm_head.weight ignored (GPT-2 ties the LM head to wte)")
                continue
        else:
            canon = name
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                warn(f"{path}: lm_head.weight ignored (tie_word_embeddings is true)")
                continue
        if canon not in shapes:
            warn(f"{path}: tensor '{name}' is not a parameter of this model; ignored")
            continue
        if canon in canon_to_file:
            raise RefError(f"{path}: weight '{canon}' given twice (as '{canon_to_file[canon]}' and '{name}')")
        canon_to_file[canon] = name
    for canon in shapes:
        if canon not in canon_to_file:
            raise RefError(f"{path}: missing required weight '{canon}'")
    return canon_to_file


def load_weights(cfg, path, dtype, requires_grad):
    try:
        tensors, _ = st.load(path)
    except OSError as e:
        raise RefError(f"{path}: cannot read weights ({e.strerror})")
    except st.SafetensorsError as e:
        raise RefError(str(e))
    names = map_weight_names(cfg, list(tensors), path)
    params = {}
    for canon, shape in tm.param_shapes(cfg).items():
        t = tensors[names[canon]]
        if tuple(t.shape) != tuple(shape):
            raise RefError(f"{path}: weight '{names[canon]}' has shape {list(t.shape)}, expected {list(shape)}")
        if not t.is_floating_point():
            raise RefError(f"{path}: weight '{names[canon]}' has dtype {t.dtype}, expected a float type")
        params[canon] = t.to(dtype).contiguous().requires_grad_(requires_grad)
    return params, names


def load_batch(cfg, path):
    try:
        tensors, _ = st.load(path)
    except OSError as e:
        raise RefError(f"{path}: cannot read batch ({e.strerror})")
    except st.SafetensorsError as e:
        raise RefError(str(e))
    return check_batch(cfg, tensors, path)


def check_batch(cfg, tensors, path, suffix=""):
    """Validates input_ids{suffix}, labels{suffix}, position_ids{suffix} in `tensors` (read from `path`).
    Returns dict input_ids, labels, position_ids (int64 [B, S])."""
    out = {}
    for key in ("input_ids", "labels", "position_ids"):
        if key + suffix not in tensors:
            raise RefError(f"{path}: missing tensor '{key}{suffix}'")
        t = tensors[key + suffix]
        if t.dtype not in (torch.int64, torch.int32):
            raise RefError(f"{path}: '{key}{suffix}' has dtype {t.dtype}, expected I64")
        if t.dim() != 2:
            raise RefError(f"{path}: '{key}{suffix}' has shape {list(t.shape)}, expected [B, S]")
        out[key] = t.to(torch.int64)
    shape = out["input_ids"].shape
    for key in ("labels", "position_ids"):
        if out[key].shape != shape:
            raise RefError(f"{path}: '{key}{suffix}' has shape {list(out[key].shape)}, expected {list(shape)} "
                           f"like input_ids{suffix}")
    V = cfg.vocab_size
    ids, labels, pos = out["input_ids"], out["labels"], out["position_ids"]
    if ids.numel() == 0:
        raise RefError(f"{path}: empty batch{suffix} {list(shape)}")
    if ids.min() < 0 or ids.max() >= V:
        raise RefError(f"{path}: input_ids{suffix} outside [0, {V})")
    bad = (labels != -100) & ((labels < 0) | (labels >= V))
    if bad.any():
        raise RefError(f"{path}: labels{suffix} must be in [0, {V}) or -100")
    if pos.min() < 0:
        raise RefError(f"{path}: negative position_ids{suffix}")
    if cfg.arch == "gpt2" and pos.max() >= cfg.max_position_embeddings:
        raise RefError(f"{path}: position_ids{suffix} up to {int(pos.max())} but max_position_embeddings is "
                       f"{cfg.max_position_embeddings}")
    return out


def masked_labels(batch, tensors, path):
    """HF's rule on the window: tokens = input_ids then the last label; hf_labels = tokens with -100
    where loss_mask is 0; the model's targets are hf_labels[:, 1:]."""
    ids, labels = batch["input_ids"], batch["labels"]
    B, S = ids.shape
    if "loss_mask" not in tensors:
        raise RefError(f"{path}: --loss-mask needs a tensor 'loss_mask' [B, S + 1]")
    mask = tensors["loss_mask"].to(torch.int64)
    if list(mask.shape) != [B, S + 1]:
        raise RefError(f"{path}: loss_mask has shape {list(mask.shape)}, expected {[B, S + 1]}")
    if bool((labels == -100).any()):
        raise RefError(f"{path}: --loss-mask needs the raw next tokens as labels (no -100)")
    tokens = torch.cat([ids, labels[:, -1:]], dim=1)  # the window's S + 1 tokens
    hf_labels = torch.where(mask != 0, tokens, torch.full_like(tokens, -100))
    return hf_labels[:, 1:].contiguous()


def run(cfg, params, batch, want_grads, mask=None):
    """Returns (logits, loss, loss_sum, valid_count, {canonical name: grad} or None)."""
    with torch.set_grad_enabled(want_grads):
        router = [] if cfg.output_router_logits else None
        logits = tm.forward(cfg, params, batch["input_ids"], batch["position_ids"], mask, router=router)
        loss, loss_sum, valid = tm.token_loss(logits, batch["labels"])
        if router:  # the load-balancing loss, as transformers adds it to the loss
            loss = loss + cfg.router_aux_loss_coef * tm.load_balancing_loss(router, cfg.num_experts,
                                                                              cfg.num_experts_per_tok)
    grads = None
    if want_grads:
        names = list(params)
        gs = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        grads = {n: (g if g is not None else torch.zeros_like(params[n])) for n, g in zip(names, gs)}
    return logits.detach(), loss.detach(), loss_sum.detach(), valid, grads


def threads_from_env():
    """torch.set_num_threads($OMP_NUM_THREADS) when that is set (a warning when it is not an integer)."""
    threads = os.environ.get("OMP_NUM_THREADS", "").strip()
    if threads:
        try:
            torch.set_num_threads(max(1, int(threads)))
        except ValueError:
            warn(f"OMP_NUM_THREADS={threads!r} is not an integer; ignored")


def save_output(path, out, meta):
    """Writes OUT; returns the exit code: 0, or 3 (one "error: ..." line on stderr) when it cannot."""
    try:
        st.save(path, out, meta)
    except OSError as e:
        print(f"error: {path}: cannot write output ({e.strerror})", file=sys.stderr)
        return 3
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--out", required=True)
    ap.add_argument("--grads", action="store_true", help="also write grad.<weight name> for every weight")
    ap.add_argument("--eos", type=int, help="packed documents separated by this token (see above)")
    ap.add_argument("--loss-mask", action="store_true", help="apply IN's loss_mask [B, S + 1] (see above)")
    args = ap.parse_args(argv)

    threads_from_env()

    dtype = DTYPES[args.dtype]
    try:
        cfg = load_config(args.config)
        params, names = load_weights(cfg, args.weights, dtype, args.grads)
        batch = load_batch(cfg, args.batch)
    except RefError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.loss_mask:
        try:
            batch["labels"] = masked_labels(batch, st.load(args.batch)[0], args.batch)
        except RefError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if int((batch["labels"] != -100).sum()) == 0:
        warn(f"{args.batch}: every label is -100; loss is 0/0 = nan (like F.cross_entropy)")

    mask = None
    if args.eos is not None:
        if not 0 <= args.eos < cfg.vocab_size:
            print(f"error: --eos {args.eos} is outside the vocabulary [0, {cfg.vocab_size})", file=sys.stderr)
            return 2
        mask, batch["position_ids"], batch["labels"] = tm.document_batch(batch["input_ids"], batch["labels"], args.eos)
    logits, loss, loss_sum, valid, grads = run(cfg, params, batch, args.grads, mask)
    out = {"logits": logits, "loss": loss.reshape(()), "loss_sum": loss_sum.reshape(()),
           "valid_count": valid.to(torch.int64).reshape(())}
    if args.eos is not None:
        out["position_ids"] = batch["position_ids"]
    if args.eos is not None or args.loss_mask:
        out["labels"] = batch["labels"]
    if grads is not None:
        for canon in params:
            out["grad." + names[canon]] = grads[canon]
    meta = {"arch": cfg.arch, "dtype": args.dtype, "producer": "tests/ref/model_ref.py",
            "torch": torch.__version__}
    return save_output(args.out, out, meta)


if __name__ == "__main__":
    sys.exit(main())
