#!/usr/bin/python3
"""Self-tests for tests/ref/train_ref.py. Run on its own (/usr/bin/python3 tests/ref/selftest_train.py) or
from tests/ref/selftest.py. Exits non-zero on failure.

1. LR schedule at hand-computed points (warmup, cosine decay, warmup >= steps, warmup 0, clamp).
2. Param groups: tensor counts with / without weight decay for GPT-2 (tied), Llama untied and tied; and
   behaviourally: with every gradient zeroed, decayed tensors shrink by prod(1 - lr_s wd), others stay.
3. Clipping: huge grad_clip and grad_clip 0 leave gradients bit-identical; a small one scales them by
   grad_clip / (norm + 1e-6); recorded norms are pre-clip; training with grad_clip 1e9 == grad_clip 0.
4. A hand-written numpy float64 AdamW (PyTorch docs formula) reproduces torch.optim.AdamW over 3 steps
   to 1e-12: (a) fed the gradients train_ref used; (b) a fully independent loop (numpy clipping, schedule,
   groups, AdamW; only the gradient comes from torch_models) vs the train_ref.py CLI output.
5. CLI: output names/shapes/dtypes, step-0 loss and gradient norm vs model_ref.py, float32 vs float64,
   no-prefix GPT-2 names, a subprocess run, and error exits (code 2, one "error:" line).
"""
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import make_case  # noqa: E402
import model_ref  # noqa: E402
import safetensors_io as st  # noqa: E402
import torch_models as tm  # noqa: E402
import train_ref  # noqa: E402

FAILURES = []
CHECKS = [0]


def check(cond, what):
    CHECKS[0] += 1
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}")


def maxdiff(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def run_main(main, argv):
    """A script's main(argv) in-process; returns (rc, stderr text)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
    return rc, err.getvalue()


def run_train(argv):
    """train_ref.main in-process; returns (rc, stderr text)."""
    return run_main(train_ref.main, argv)


GPT2 = {"arch": "gpt2", "vocab_size": 37, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 16}
LLAMA = {"arch": "llama", "vocab_size": 41, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 40, "max_position_embeddings": 64, "rope_theta": 500.0,
         "norm_eps": 1e-5, "tie_word_embeddings": False}
LLAMA_TIED = {"arch": "llama", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 1,
              "num_attention_heads": 3, "intermediate_size": 20, "tie_word_embeddings": True}


def make_batches(cfg, seed, steps, B, S, pos_offset=0):
    """Per-step batches (list of dicts) and the flat safetensors dict input_ids_{k}, ..."""
    batches, flat = [], {}
    for k in range(steps):
        b = make_case.make_batch(cfg, seed + 101 * k, B, S, ignore_frac=0.2, position_offset=pos_offset)
        batches.append(b)
        for n, v in b.items():
            flat[f"{n}_{k}"] = v
    return batches, flat


def write_case(tmp, tag, model, train, steps, B=2, S=6, seed=1, std=0.02, prefix=True):
    cfg = tm.ModelConfig(model)
    paths = {x: os.path.join(tmp, f"{tag}.{x}") for x in ("json", "w", "b")}
    write_json(paths["json"], {"model": model, "train": train})
    weights = make_case.make_weights(cfg, seed, std=std, prefix=prefix)
    st.save(paths["w"], weights)
    batches, flat = make_batches(cfg, seed, steps, B, S)
    st.save(paths["b"], flat)
    return cfg, weights, batches, paths


# ---------------------------------------------------------------------------------------------------
# 1. schedule

def test_schedule():
    print("schedule:")
    T = train_ref.TrainConfig
    t = T({"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 4})
    # hand-computed: warmup lr*(s+1)/4; decay_steps = 12 - 4 = 8
    pts = [(0, 12, t, 2.5e-4), (1, 12, t, 5e-4), (3, 12, t, 1e-3),
           (4, 12, t, 1e-3),                       # progress 0
           (6, 12, t, 8.681980515339464e-4),       # progress 1/4: 1e-4 + 4.5e-4 (1 + cos(pi/4))
           (8, 12, t, 5.5e-4),                     # progress 1/2
           (11, 12, t, 1.3425421036992098e-4),     # progress 7/8: 1e-4 + 4.5e-4 (1 + cos(7pi/8))
           (20, 12, t, 1e-4),                      # progress clamped to 1
           (0, 1, T({"lr": 1e-3, "warmup_steps": 0}), 1e-3),
           (4, 5, T({"lr": 1e-3, "min_lr": 0.0, "warmup_steps": 0}), 9.549150281252625e-05),  # 0.5e-3 (1+cos .8pi)
           (2, 3, T({"lr": 1e-3, "warmup_steps": 10}), 3e-4),   # warmup longer than the run
           (3, 4, T({"lr": 2e-3, "min_lr": 5e-4, "warmup_steps": 3}), 2e-3),  # decay_steps = max(1, 1)
           (3, 3, T({"lr": 2e-3, "min_lr": 5e-4, "warmup_steps": 3}), 2e-3),  # decay_steps = max(1, 0) = 1
           (4, 3, T({"lr": 2e-3, "min_lr": 5e-4, "warmup_steps": 3}), 5e-4)]  # progress (4-3)/1 = 1
    worst = 0.0
    for s, n, tc, want in pts:
        got = train_ref.lr_at(s, n, tc)
        worst = max(worst, abs(got - want) / want)
        check(abs(got - want) <= 1e-14 * want, f"lr_at({s}, steps={n}, {tc.as_dict()}) = {got!r}, want {want!r}")
    d = T().as_dict()
    check(d == {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "weight_decay": 0.1, "beta1": 0.9,
                "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0}, f"train defaults {d}")
    print(f"  {len(pts)} hand-computed points, worst rel err {worst:.1e}; defaults ok")


# ---------------------------------------------------------------------------------------------------
# 2. param groups

def test_groups():
    print("param groups:")
    # (model, expected decay count, expected no-decay count)
    L = 2
    cases = [("gpt2", GPT2, 2 + 4 * L, 8 * L + 2),          # wte, wpe, 4 matrices/layer | 8 vectors/layer + ln_f
             ("llama_untied", LLAMA, 2 + 7 * L, 2 * L + 1),  # embed, lm_head, 7/layer | 2 norms/layer + norm
             ("llama_tied", LLAMA_TIED, 1 + 7, 2 + 1)]
    t = train_ref.TrainConfig({"weight_decay": 0.25})
    for tag, model, n_decay, n_plain in cases:
        cfg = tm.ModelConfig(model)
        params = {k: v.requires_grad_(True) for k, v in
                  tm.init_params(cfg, torch.Generator().manual_seed(0), dtype=torch.float64).items()}
        decay, plain = train_ref.split_decay(params)
        check(len(decay) == n_decay and len(plain) == n_plain,
              f"{tag}: {len(decay)} decay / {len(plain)} no-decay tensors, want {n_decay} / {n_plain}")
        check(all(n.endswith(".bias") or tm.is_norm_weight(n) for n in plain), f"{tag}: no-decay names {plain}")
        check(not any(n.endswith(".bias") or tm.is_norm_weight(n) for n in decay), f"{tag}: decay names")
        opt = train_ref.make_optimizer(params, t)
        g = opt.param_groups
        wds = [x["weight_decay"] for x in g]
        check(wds == [0.25, 0.0], f"{tag}: group weight decays {wds}, want [0.25, 0.0]")
        members = [[id(p) for p in x["params"]] for x in g]
        check(members == [[id(params[n]) for n in decay], [id(params[n]) for n in plain]], f"{tag}: group members")
        n_opt = sum(len(x["params"]) for x in g)
        check(n_opt == len(params) == len(tm.param_shapes(cfg)), f"{tag}: {n_opt} optimizer params")
        if model["arch"] == "gpt2" or model.get("tie_word_embeddings"):
            check(not any("lm_head" in n for n in params), f"{tag}: tied head is not a separate parameter")
        print(f"  {tag:14s} decay {len(decay):2d}  no-decay {len(plain):2d}")

    # behaviour: zero every gradient before the step -> Adam term is 0, only decoupled decay acts
    cfg = tm.ModelConfig(GPT2)
    params0 = tm.init_params(cfg, torch.Generator().manual_seed(3), dtype=torch.float64)
    params = {k: v.clone().requires_grad_(True) for k, v in params0.items()}
    tc = train_ref.TrainConfig({"lr": 0.05, "min_lr": 0.01, "warmup_steps": 1, "weight_decay": 0.5})
    batches, _ = make_batches(cfg, 3, 3, 1, 5)
    lrs_seen = []

    def zero_grads(step, ps, lr):
        lrs_seen.append(lr)
        for p in ps.values():
            p.grad.zero_()
    _, _, lrs = train_ref.train(cfg, params, batches, tc, 3, on_step=zero_grads)
    shrink = float(np.prod([1.0 - lr * 0.5 for lr in lrs]))
    worst = 0.0
    for n, p in params.items():
        want = params0[n] * (shrink if p.dim() >= 2 else 1.0)
        e = maxdiff(p.detach(), want)
        worst = max(worst, e)
        check(e <= 1e-15, f"zero-grad steps: {n} {'decayed' if p.dim() >= 2 else 'unchanged'}: diff {e:.2e}")
    check(lrs_seen == lrs and shrink < 0.95, f"zero-grad steps: lrs {lrs}")
    print(f"  zero gradients, 3 steps: decayed x{shrink:.6f}, others unchanged (worst diff {worst:.0e})")


# ---------------------------------------------------------------------------------------------------
# 3. clipping

def test_clipping(tmp):
    print("clipping:")
    g = torch.Generator().manual_seed(5)
    shapes = [(3, 4), (7,), (2, 2, 2), ()]

    def fresh():
        ps = []
        for shp in shapes:
            p = torch.zeros(shp, dtype=torch.float64, requires_grad=True)
            p.grad = torch.randn(shp, generator=g, dtype=torch.float64) * 3.0
            ps.append(p)
        return ps
    ps = fresh()
    orig = [p.grad.clone() for p in ps]
    want_norm = math.sqrt(sum(float((o.numpy() ** 2).sum()) for o in orig))
    for clip in (1e9, 0.0):
        n = train_ref.clip_gradients(ps, clip)
        check(abs(float(n) - want_norm) <= 1e-14 * want_norm, f"clip {clip}: norm {float(n)} vs {want_norm}")
        check(all(torch.equal(p.grad, o) for p, o in zip(ps, orig)), f"clip {clip}: gradients changed")
    clip = 0.25 * want_norm
    n = train_ref.clip_gradients(ps, clip)
    coef = clip / (want_norm + 1e-6)
    e = max(maxdiff(p.grad, o * coef) for p, o in zip(ps, orig))
    check(abs(float(n) - want_norm) <= 1e-14 * want_norm, "small clip: returns the pre-clip norm")
    check(e <= 1e-15 * want_norm, f"small clip: gradients not scaled by clip/(norm+1e-6): diff {e:.2e}")
    after = math.sqrt(sum(float((p.grad.numpy() ** 2).sum()) for p in ps))
    check(abs(after - clip) <= 1e-6, f"small clip: norm after clipping {after} vs {clip}")
    print(f"  norm {want_norm:.6f}; clip 1e9 / 0 leave gradients bit-identical; clip {clip:.4f} -> norm {after:.6f}")

    # end to end: grad_clip 1e9 == grad_clip 0 bit for bit; a small clip changes the trajectory
    train = {"lr": 0.01, "min_lr": 0.001, "warmup_steps": 1}
    outs = {}
    for clip in (1e9, 0.0, 0.05):
        tag = f"clip_{clip:g}"
        cfg, weights, batches, paths = write_case(tmp, tag, GPT2, dict(train, grad_clip=clip), 4, seed=9)
        out = os.path.join(tmp, tag + ".out")
        rc, err = run_train(["--config", paths["json"], "--weights", paths["w"], "--batches", paths["b"],
                             "--steps", "4", "--dtype", "float64", "--out", out])
        check(rc == 0, f"{tag}: rc {rc} {err}")
        outs[clip] = st.load(out)[0] if rc == 0 else None
    if all(outs.values()):
        a, b, c = outs[1e9], outs[0.0], outs[0.05]
        check(list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), "grad_clip 1e9 and 0 differ")
        check(torch.equal(a["grad_norms"][:1], c["grad_norms"][:1]), "step-0 pre-clip norm depends on clip")
        check(bool((c["grad_norms"] > 0.05).all()), f"clip 0.05 never active: {c['grad_norms'].tolist()}")
        d = maxdiff(a["final.transformer.wte.weight"], c["final.transformer.wte.weight"])
        check(d > 1e-6, f"clip 0.05 did not change the trajectory ({d:.1e})")
        check(not torch.equal(a["losses"][1:], c["losses"][1:]), "clip 0.05: losses unchanged")
        print(f"  end to end: clip 1e9 == clip 0 bit for bit; clip 0.05 moves final wte by {d:.1e}")


# ---------------------------------------------------------------------------------------------------
# 4. AdamW vs numpy

def np_adamw_step(W, G, M, Vv, t, lr, wd_of, b1, b2, eps):
    """One AdamW step (PyTorch docs formula), in place; t counts from 1."""
    for n in W:
        p, g = W[n], G[n]
        p -= lr * wd_of(p) * p
        M[n] = b1 * M[n] + (1.0 - b1) * g
        Vv[n] = b2 * Vv[n] + (1.0 - b2) * g * g
        denom = np.sqrt(Vv[n]) / math.sqrt(1.0 - b2 ** t) + eps
        p -= lr / (1.0 - b1 ** t) * M[n] / denom


def np_lr(s, n, lr, min_lr, warmup):
    """The schedule written out again, without train_ref."""
    if s < warmup:
        return lr * (s + 1) / warmup
    p = (s - warmup) / max(1, n - warmup)
    p = 1.0 if p > 1.0 else p
    return min_lr + (lr - min_lr) * (1.0 + math.cos(math.pi * p)) / 2.0


TRAIN_ODD = {"lr": 0.02, "min_lr": 0.002, "warmup_steps": 1, "weight_decay": 0.3, "beta1": 0.8, "beta2": 0.9,
             "eps": 1e-6, "grad_clip": 1.0}


def test_adamw_recorded():
    """(a) numpy AdamW fed the gradients (after clipping) and lrs that train_ref used."""
    cfg = tm.ModelConfig(dict(GPT2, num_hidden_layers=1))
    params0 = tm.init_params(cfg, torch.Generator().manual_seed(21), dtype=torch.float64, std=0.3)
    params = {k: v.clone().requires_grad_(True) for k, v in params0.items()}
    tc = train_ref.TrainConfig(TRAIN_ODD)
    batches, _ = make_batches(cfg, 21, 3, 2, 6)
    seen = []

    def record(step, ps, lr):
        seen.append(({n: p.detach().numpy().copy() for n, p in ps.items()},
                     {n: p.grad.numpy().copy() for n, p in ps.items()}, lr))
    _, norms, _ = train_ref.train(cfg, params, batches, tc, 3, on_step=record)
    W = {n: p.numpy().copy() for n, p in params0.items()}
    M = {n: np.zeros_like(w) for n, w in W.items()}
    Vv = {n: np.zeros_like(w) for n, w in W.items()}
    wd_of = lambda p: 0.3 if p.ndim >= 2 else 0.0  # noqa: E731
    worst = 0.0
    for s, (before, grads, lr) in enumerate(seen):
        e = max(maxdiff(W[n], before[n]) for n in W)
        check(e <= 1e-12, f"recorded AdamW: weights before step {s} differ by {e:.2e}")
        np_adamw_step(W, grads, M, Vv, s + 1, lr, wd_of, 0.8, 0.9, 1e-6)
    for n, p in params.items():
        e = maxdiff(W[n], p.detach())
        worst = max(worst, e)
        check(e <= 1e-12, f"recorded AdamW: final {n} differs by {e:.2e}")
    moved = max(maxdiff(W[n], params0[n]) for n in W)
    check(moved > 1e-3, f"recorded AdamW: weights barely moved ({moved:.1e})")
    check(any(float(x) > 1.0 for x in norms), f"recorded AdamW: clipping never active {[float(x) for x in norms]}")
    print(f"  (a) recorded grads, 3 steps: max |numpy - torch| {worst:.1e} (weights moved {moved:.2f})")


def np_train(cfg, W, batches, tr, steps):
    """(b) Independent loop: numpy AdamW/clip/schedule/groups; gradient from torch_models autograd."""
    W = {n: w.copy() for n, w in W.items()}
    M = {n: np.zeros_like(w) for n, w in W.items()}
    Vv = {n: np.zeros_like(w) for n, w in W.items()}
    wd = tr["weight_decay"]
    losses, norms, lrs = [], [], []
    for s in range(steps):
        tp = {n: torch.from_numpy(w.copy()).requires_grad_(True) for n, w in W.items()}
        b = batches[s]
        logits = tm.forward(cfg, tp, b["input_ids"], b["position_ids"])
        loss = tm.token_loss(logits, b["labels"])[0]
        gs = torch.autograd.grad(loss, list(tp.values()))
        G = {n: g.numpy().copy() for n, g in zip(tp, gs)}
        norm = math.sqrt(sum(float((g * g).sum()) for g in G.values()))
        if tr["grad_clip"] > 0:
            coef = min(1.0, tr["grad_clip"] / (norm + 1e-6))
            G = {n: g * coef for n, g in G.items()}
        lr = np_lr(s, steps, tr["lr"], tr["min_lr"], tr["warmup_steps"])
        np_adamw_step(W, G, M, Vv, s + 1, lr, lambda p: wd if len(p.shape) >= 2 else 0.0,
                      tr["beta1"], tr["beta2"], tr["eps"])
        losses.append(float(loss))
        norms.append(norm)
        lrs.append(lr)
    return W, losses, norms, lrs


def test_adamw_independent(tmp):
    """(b) the whole loop in numpy vs the train_ref.py CLI, GPT-2 (tied) and Llama (GQA, untied)."""
    for tag, model, clip in (("gpt2", dict(GPT2, num_hidden_layers=1), 1.0), ("llama", LLAMA, 0.5)):
        tr = dict(TRAIN_ODD, grad_clip=clip)
        steps = 3
        cfg, weights, batches, paths = write_case(tmp, "np_" + tag, model, tr, steps, seed=31, std=0.3)
        out = os.path.join(tmp, f"np_{tag}.out")
        rc, err = run_train(["--config", paths["json"], "--weights", paths["w"], "--batches", paths["b"],
                             "--steps", str(steps), "--dtype", "float64", "--out", out])
        check(rc == 0, f"independent {tag}: rc {rc} {err}")
        if rc != 0:
            continue
        r, _ = st.load(out)
        W0 = {n: w.numpy() for n, w in weights.items()}
        W, losses, norms, lrs = np_train(cfg, W0, batches, tr, steps)
        e_w = max(maxdiff(W[n], r["final." + n]) for n in W)
        e_l, e_n, e_lr = maxdiff(losses, r["losses"]), maxdiff(norms, r["grad_norms"]), maxdiff(lrs, r["lrs"])
        check(e_w <= 1e-12, f"independent {tag}: final weights differ by {e_w:.2e}")
        check(e_l <= 1e-12 and e_n <= 1e-12 and e_lr <= 1e-18,
              f"independent {tag}: losses {e_l:.1e} norms {e_n:.1e} lrs {e_lr:.1e}")
        check(any(x > clip for x in norms), f"independent {tag}: clipping never active {norms}")
        print(f"  (b) {tag:6s} independent loop, {steps} steps: |dW| {e_w:.1e} |dloss| {e_l:.1e} "
              f"|dnorm| {e_n:.1e} |dlr| {e_lr:.0e}  norms {[round(x, 3) for x in norms]}")


# ---------------------------------------------------------------------------------------------------
# 5. CLI

def test_cli(tmp):
    print("CLI:")
    steps = 6
    train = {"lr": 0.01, "min_lr": 0.001, "warmup_steps": 2, "steps": 1000, "seed": 3}
    cfg, weights, batches, paths = write_case(tmp, "cli", LLAMA, train, steps, S=7, seed=41)
    out64, out32 = os.path.join(tmp, "cli.out64"), os.path.join(tmp, "cli.out32")
    base = ["--config", paths["json"], "--weights", paths["w"], "--batches", paths["b"], "--steps", str(steps)]
    rc, err = run_train(base + ["--dtype", "float64", "--out", out64])
    check(rc == 0 and err == "", f"cli float64: rc {rc} {err}")
    rc, err = run_train(base + ["--dtype", "float32", "--out", out32])
    check(rc == 0, f"cli float32: rc {rc} {err}")
    r64, meta = st.load(out64)
    r32, _ = st.load(out32)
    want = ["losses", "grad_norms", "lrs"] + ["final." + n for n in weights]
    check(list(r64) == want, f"cli: output names {list(r64)[:5]}...")
    for k in ("losses", "grad_norms", "lrs"):
        check(tuple(r64[k].shape) == (steps,) and r64[k].dtype == torch.float64, f"cli: {k} shape/dtype")
    check(r32["losses"].dtype == torch.float32 and r32["grad_norms"].dtype == torch.float32 and
          r32["lrs"].dtype == torch.float64 and r32["final.lm_head.weight"].dtype == torch.float32, "cli: f32 dtypes")
    check(all(tuple(r64["final." + n].shape) == tuple(w.shape) for n, w in weights.items()), "cli: final shapes")
    tc = train_ref.TrainConfig({k: v for k, v in train.items()})
    check(r64["lrs"].tolist() == [train_ref.lr_at(s, steps, tc) for s in range(steps)],
          "cli: lrs use --steps, not train.steps")
    check(meta.get("steps") == str(steps) and json.loads(meta["train"])["lr"] == 0.01, f"cli: metadata {meta}")
    # step 0 against model_ref on the initial weights
    b0 = os.path.join(tmp, "cli.b0")
    st.save(b0, batches[0])
    mr = os.path.join(tmp, "cli.mr")
    with contextlib.redirect_stderr(io.StringIO()):
        rc = model_ref.main(["--config", paths["json"], "--weights", paths["w"], "--batch", b0,
                             "--dtype", "float64", "--out", mr, "--grads"])
    check(rc == 0, "model_ref on batch 0")
    m, _ = st.load(mr)
    gnorm = math.sqrt(sum(float((v.numpy() ** 2).sum()) for k, v in m.items() if k.startswith("grad.")))
    check(abs(float(r64["losses"][0]) - float(m["loss"])) <= 1e-13, "cli: step-0 loss vs model_ref")
    check(abs(float(r64["grad_norms"][0]) - gnorm) <= 1e-12 * gnorm, "cli: step-0 grad norm vs model_ref grads")
    e = maxdiff(r32["losses"], r64["losses"])
    e_w = max(maxdiff(r32[k], r64[k]) for k in r64 if k.startswith("final."))
    check(e <= 1e-4 and e_w <= 1e-4, f"cli: float32 vs float64 losses {e:.1e} weights {e_w:.1e}")
    l = r64["losses"].tolist()
    print(f"  llama {steps} steps: losses {l[0]:.4f} -> {l[-1]:.4f}; step 0 = model_ref; f32 vs f64 "
          f"|dloss| {e:.1e} |dW| {e_w:.1e}")

    # a repeated batch must be learned
    cfg_r, w_r, _, p_r = write_case(tmp, "rep", GPT2, {"lr": 0.01, "warmup_steps": 0}, 1, seed=43, std=0.3)
    bat = make_case.make_batch(cfg_r, 43, 2, 8)
    st.save(p_r["b"], {f"{n}_{k}": v for k in range(8) for n, v in bat.items()})
    out = os.path.join(tmp, "rep.out")
    rc, err = run_train(["--config", p_r["json"], "--weights", p_r["w"], "--batches", p_r["b"], "--steps", "8",
                         "--dtype", "float32", "--out", out])
    check(rc == 0, f"repeated batch: rc {rc} {err}")
    if rc == 0:
        lr_ = st.load(out)[0]["losses"].tolist()
        check(lr_[-1] < lr_[0] - 0.1, f"repeated batch: loss did not fall {lr_}")
        print(f"  gpt2 repeated batch: loss {lr_[0]:.4f} -> {lr_[-1]:.4f}")

    # GPT-2 weights without the "transformer." prefix: same numbers under the file's names
    for tag, prefix in (("np1", True), ("np0", False)):
        write_case(tmp, tag, GPT2, {}, 2, seed=47, prefix=prefix)
    outs = []
    for tag in ("np1", "np0"):
        o = os.path.join(tmp, tag + ".out")
        rc, err = run_train(["--config", os.path.join(tmp, tag + ".json"), "--weights", os.path.join(tmp, tag + ".w"),
                             "--batches", os.path.join(tmp, tag + ".b"), "--steps", "2", "--out", o])
        check(rc == 0, f"{tag}: rc {rc} {err}")
        outs.append(st.load(o)[0] if rc == 0 else {})
    a, b = outs
    check("final.h.0.attn.c_attn.weight" in b and "final.wte.weight" in b and
          not any(k.startswith("final.transformer.") for k in b), f"no-prefix output names {list(b)[:5]}")
    check(len(a) == len(b) and all(torch.equal(a[k], b[k.replace("final.transformer.", "final.")]) for k in a),
          "prefix and no-prefix runs differ")

    # errors
    print("  errors:")
    flat, _ = st.load(paths["b"])

    def expect_error(tag, needle, cfg_obj=None, batches_flat=None, steps_arg=str(steps), weights_path=None):
        cp, bp = paths["json"], paths["b"]
        if cfg_obj is not None:
            cp = os.path.join(tmp, f"e_{tag}.json")
            write_json(cp, cfg_obj)
        if batches_flat is not None:
            bp = os.path.join(tmp, f"e_{tag}.b")
            st.save(bp, batches_flat)
        o = os.path.join(tmp, f"e_{tag}.out")
        rc, err = run_train(["--config", cp, "--weights", weights_path or paths["w"], "--batches", bp,
                             "--steps", steps_arg, "--out", o])
        lines = err.strip().splitlines()
        ok = rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
        check(ok and not os.path.exists(o), f"error case {tag}: rc={rc} stderr={err.strip()!r}")
        print(f"    {tag:22s} rc={rc}  {lines[-1] if lines else ''}")

    expect_error("missing_step", "input_ids_6", steps_arg="7")
    expect_error("steps_zero", "--steps", steps_arg="0")
    no_lab = dict(flat)
    del no_lab["labels_3"]
    expect_error("missing_labels_3", "labels_3", batches_flat=no_lab)
    all_ign = dict(flat, labels_2=torch.full_like(flat["labels_2"], -100))
    expect_error("all_labels_ignored", "labels_2", batches_flat=all_ign)
    expect_error("token_out_of_range", "input_ids_1", batches_flat=dict(flat, input_ids_1=flat["input_ids_1"] + 99))
    expect_error("unknown_train_key", "train.momentum", cfg_obj={"model": LLAMA, "train": {"momentum": 0.9}})
    expect_error("beta1_is_1", "train.beta1", cfg_obj={"model": LLAMA, "train": {"beta1": 1.0}})
    expect_error("warmup_not_int", "train.warmup_steps", cfg_obj={"model": LLAMA, "train": {"warmup_steps": 2.5}})
    expect_error("min_lr_above_lr", "train.min_lr", cfg_obj={"model": LLAMA, "train": {"lr": 1e-4, "min_lr": 1e-3}})
    expect_error("train_not_object", "train", cfg_obj={"model": LLAMA, "train": [1]})
    expect_error("bad_model", "model.arch", cfg_obj={"model": dict(LLAMA, arch="bert")})
    expect_error("missing_weights_file", "nope.w", weights_path=os.path.join(tmp, "nope.w"))

    # as a real process
    script = os.path.join(_HERE, "train_ref.py")
    o = os.path.join(tmp, "proc.out")
    p = subprocess.run(["/usr/bin/python3", script] + base + ["--dtype", "float64", "--out", o],
                       env=dict(os.environ, OMP_NUM_THREADS="2"), capture_output=True, text=True)
    check(p.returncode == 0, f"subprocess rc {p.returncode}: {p.stderr}")
    if p.returncode == 0:
        a, _ = st.load(o)
        check(list(a) == list(r64) and all(torch.allclose(a[k], r64[k], rtol=1e-12, atol=1e-14) for k in a),
              "subprocess output equals in-process output")
    p = subprocess.run(["/usr/bin/python3", script] + base[:-1] + ["99", "--out", o], capture_output=True, text=True)
    check(p.returncode == 2 and p.stderr.startswith("error:"), f"subprocess error rc {p.returncode} {p.stderr}")
    print(f"  subprocess: rc=0 run matches; --steps 99 -> rc={p.returncode} {p.stderr.strip()}")


def run_all():
    """Runs every check; returns (number of checks, list of failures)."""
    with tempfile.TemporaryDirectory() as tmp:
        test_schedule()
        test_groups()
        test_clipping(tmp)
        print("AdamW vs numpy float64:")
        test_adamw_recorded()
        test_adamw_independent(tmp)
        test_cli(tmp)
    return CHECKS[0], FAILURES


def main():
    t0 = time.time()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2") or 2))
    n, fails = run_all()
    print(f"train_ref: {n} checks, {len(fails)} failures, {time.time() - t0:.1f}s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
