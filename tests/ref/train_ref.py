#!/usr/bin/python3
"""Independent PyTorch reference for autosp's training loop: AdamW, LR schedule, clipping, loss trajectory.

  /usr/bin/python3 tests/ref/train_ref.py --config CFG.json --weights W.safetensors \
      --batches B.safetensors --steps N --dtype float32|float64 --out OUT.safetensors

CFG.json   an autosp config: its "model" object is read as model_ref.py reads it, and its "train" object
           for lr, min_lr, warmup_steps, weight_decay, beta1, beta2, eps, grad_clip (defaults 1e-3, 1e-4,
           10, 0.1, 0.9, 0.95, 1e-8, 1.0). train.steps/seed/log_every/checkpoint_* are accepted and
           ignored (the step count is --steps); any other train key is an error.
W          initial weights, Hugging Face names (as model_ref.py; cast to --dtype).
B          input_ids_{k}, labels_{k}, position_ids_{k} (I64 [B, S]) for k = 0..N-1: the batch of step k
           (labels already shifted; -100 = ignored). Shapes may differ between steps; extra tensors are
           ignored. A step whose labels are all -100 is an error (its loss would be 0/0).
OUT        losses [N], grad_norms [N] (in --dtype), lrs [N] (F64), and final.<name> (in --dtype) for every
           weight, under the name used in W (tied weights: one tensor; ignored HF buffers are not written).

Per step s = 0..N-1 (the contract autosp follows):
  1. zero the gradients;
  2. forward (torch_models), loss = mean cross-entropy over labels != -100; loss.backward();
  3. grad_norms[s] = global L2 norm over all gradients before clipping (computed as
     torch.nn.utils.clip_grad_norm_ does); if grad_clip > 0: clip_grad_norm_(params, grad_clip), i.e.
     every gradient *= min(1, grad_clip / (norm + 1e-6)); grad_clip == 0: no clipping;
  4. lr(s) = lr * (s + 1) / warmup_steps                       if s < warmup_steps, else
     lr(s) = min_lr + 0.5 (lr - min_lr)(1 + cos(pi * p)),  p = min(1, (s - warmup_steps) / max(1, N - warmup_steps)),
     set on every param group;
  5. torch.optim.AdamW(betas=(beta1, beta2), eps) step; two groups: tensors with dim >= 2 use
     weight_decay, tensors with dim < 2 (biases, norm weights) use 0. Tied weights are one parameter.
     A parameter that gets no gradient is given a zero gradient (so it is still decayed and its moments
     still decay), never skipped.

Threads: torch.set_num_threads($OMP_NUM_THREADS) when that is set.
Exit codes: 0 ok; 2 bad usage/config/input (one "error: ..." line on stderr); 3 output not writable.
"""
import argparse
import json
import math
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402

import model_ref  # noqa: E402
import safetensors_io as st  # noqa: E402
import torch_models as tm  # noqa: E402

RefError = model_ref.RefError
DTYPES = model_ref.DTYPES
warn = model_ref.warn

# key -> (default, kind, lo, hi); ranges as autosp's config schema
TRAIN_KEYS = {
    "lr": (1e-3, "number", 0.0, 10.0),
    "min_lr": (1e-4, "number", 0.0, 10.0),
    "warmup_steps": (10, "integer", 0, 2**62),
    "weight_decay": (0.1, "number", 0.0, 10.0),
    "beta1": (0.9, "number", 0.0, 0.999999),
    "beta2": (0.95, "number", 0.0, 0.999999999),
    "eps": (1e-8, "number", 0.0, 1.0),
    "grad_clip": (1.0, "number", 0.0, 1e9),
}
IGNORED_TRAIN_KEYS = {"steps", "seed", "log_every", "checkpoint_dir", "checkpoint_every"}


class TrainConfig:
    """The optimizer/schedule part of an autosp "train" object, defaults filled in."""

    def __init__(self, d=None):
        d = {} if d is None else d
        if not isinstance(d, dict):
            raise RefError("train: expected a JSON object")
        for k in sorted(d):
            if k not in TRAIN_KEYS and k not in IGNORED_TRAIN_KEYS:
                raise RefError(f"train.{k}: unknown key")
        for k, (default, kind, lo, hi) in TRAIN_KEYS.items():
            v = d.get(k, default)
            if kind == "integer":
                ok = isinstance(v, int) and not isinstance(v, bool)
            else:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or not lo <= v <= hi:
                want = "a non-negative integer" if kind == "integer" else f"a number in [{lo:g}, {hi:g}]"
                raise RefError(f"train.{k}: expected {want}, got {v!r}")
            setattr(self, k, int(v) if kind == "integer" else float(v))
        if self.min_lr > self.lr:
            raise RefError(f"train.min_lr {self.min_lr} exceeds train.lr {self.lr}")

    def as_dict(self):
        return {k: getattr(self, k) for k in TRAIN_KEYS}


def lr_at(step, steps, t):
    """Learning rate of 0-based step `step` in a run of `steps` steps."""
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    decay_steps = max(1, steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / decay_steps)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + math.cos(math.pi * progress))


def split_decay(params):
    """(names with weight decay: dim >= 2, names without: dim < 2), in parameter order."""
    decay = [n for n, p in params.items() if p.dim() >= 2]
    no_decay = [n for n, p in params.items() if p.dim() < 2]
    return decay, no_decay


def make_optimizer(params, t):
    decay, no_decay = split_decay(params)
    groups = [{"params": [params[n] for n in names], "weight_decay": wd}
              for names, wd in ((decay, t.weight_decay), (no_decay, 0.0)) if names]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay)


def global_grad_norm(plist):
    """L2 norm over all gradients, computed exactly as torch.nn.utils.clip_grad_norm_ (torch 1.13) does."""
    return torch.norm(torch.stack([torch.norm(p.grad.detach(), 2.0) for p in plist]), 2.0)


def clip_gradients(plist, grad_clip):
    """Returns the pre-clip global norm; clips like clip_grad_norm_ when grad_clip > 0."""
    if grad_clip > 0:
        return torch.nn.utils.clip_grad_norm_(plist, grad_clip).detach()
    return global_grad_norm(plist)


def train(cfg, params, batches, t, steps, on_step=None):
    """Trains `params` (leaf tensors with requires_grad, canonical names) in place for `steps` steps.
    batches[k]: dict input_ids, labels, position_ids. on_step(step, params, lr), if given, is called after
    clipping and before optimizer.step() (gradients in p.grad). Returns (losses, grad_norms, lrs):
    lists of 0-d tensors in the parameter dtype, and of Python floats."""
    opt = make_optimizer(params, t)
    plist = list(params.values())
    losses, norms, lrs = [], [], []
    for s in range(steps):
        for p in plist:
            p.grad = None
        b = batches[s]
        logits = tm.forward(cfg, params, b["input_ids"], b["position_ids"])
        loss, _, _ = tm.token_loss(logits, b["labels"])
        loss.backward()
        for p in plist:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = clip_gradients(plist, t.grad_clip)
        lr = lr_at(s, steps, t)
        for group in opt.param_groups:
            group["lr"] = lr
        if on_step is not None:
            on_step(s, params, lr)
        opt.step()
        losses.append(loss.detach().reshape(()))
        norms.append(norm.reshape(()))
        lrs.append(lr)
    return losses, norms, lrs


def load_train_config(path):
    """Returns (ModelConfig, TrainConfig) from an autosp config file."""
    cfg = model_ref.load_config(path)  # reports unreadable/invalid files
    with open(path, "r", encoding="utf-8") as f:
        doc = json.load(f)
    train_obj = doc.get("train") if isinstance(doc, dict) and "model" in doc else None
    try:
        return cfg, TrainConfig(train_obj)
    except RefError as e:
        raise RefError(f"{path}: {e}")


def load_batches(cfg, path, steps):
    try:
        tensors, _ = st.load(path)
    except OSError as e:
        raise RefError(f"{path}: cannot read batches ({e.strerror})")
    except st.SafetensorsError as e:
        raise RefError(str(e))
    out = []
    for k in range(steps):
        b = model_ref.check_batch(cfg, tensors, path, suffix=f"_{k}")
        if int((b["labels"] != -100).sum()) == 0:
            raise RefError(f"{path}: every label of labels_{k} is -100 (step {k} would have loss 0/0)")
        out.append(b)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--steps", required=True, type=int)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    model_ref.threads_from_env()

    dtype = DTYPES[args.dtype]
    try:
        if args.steps < 1:
            raise RefError(f"--steps: expected a positive integer, got {args.steps}")
        cfg, tcfg = load_train_config(args.config)
        params, names = model_ref.load_weights(cfg, args.weights, dtype, True)
        batches = load_batches(cfg, args.batches, args.steps)
    except RefError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    losses, norms, lrs = train(cfg, params, batches, tcfg, args.steps)
    if not all(math.isfinite(float(x)) for x in losses + norms):
        warn("non-finite loss or gradient norm during training")
    out = {"losses": torch.stack(losses), "grad_norms": torch.stack(norms).to(dtype),
           "lrs": torch.tensor(lrs, dtype=torch.float64)}
    for canon, p in params.items():
        out["final." + names[canon]] = p.detach()
    meta = {"arch": cfg.arch, "dtype": args.dtype, "steps": str(args.steps),
            "train": json.dumps(tcfg.as_dict(), sort_keys=True), "producer": "tests/ref/train_ref.py",
            "torch": torch.__version__}
    return model_ref.save_output(args.out, out, meta)


if __name__ == "__main__":
    sys.exit(main())
