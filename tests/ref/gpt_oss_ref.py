#!/usr/bin/python3
"""A float64 reference of the whole gpt-oss model (transformers' modeling_gpt_oss.py and
configuration_gpt_oss.py, transcribed with plain torch ops; transformers 4.44 has no gpt-oss), for
the family row that will use it. Reads a Hugging Face style directory: config.json and
model.safetensors (or model.safetensors.index.json with its shards), plain tensors (the hub's MXFP4
expert blocks and scales are dequantized by the loader under test, not here).

What it computes, by HF's names:
  model.embed_tokens.weight [V, C]; per layer i (model.layers.{i}.):
    input_layernorm.weight [C], RMSNorm (x / sqrt(mean(x^2) + eps)) * w
    self_attn.{q,k,v}_proj.{weight,bias} (N·D, Nkv·D outputs), self_attn.o_proj.{weight,bias}
    RoPE with rope_theta and rope_scaling (yarn in gpt-oss's config; transformers 5's
      _compute_yarn_parameters as tests/ref/torch_models.py transcribes it), half-split rotation
    eager_attention_forward: scores = q k^T · D^-0.5 plus the mask (causal; sliding_window keys when
      layer_types[i] is "sliding_attention": key j visible from query i when i - w < j <= i; packed
      documents: j >= doc_start[i]), the sink self_attn.sinks [N] as one more column, the row max
      subtracted, softmax, the column dropped, times v (GQA: kv heads repeated)
    post_attention_layernorm.weight [C]
    mlp.router.{weight [E, C], bias [E]}: logits = linear(x), top-k of the logits, softmax over the
      k values, scattered into [T, E]
    mlp.experts.gate_up_proj [E, C, 2I], gate_up_proj_bias [E, 2I], down_proj [E, I, C],
      down_proj_bias [E, C]: per selected expert gate_up = x @ W + b, gate = gate_up[..., ::2],
      up = gate_up[..., 1::2], gate.clamp(max=limit), up.clamp(-limit, limit),
      glu = gate · sigmoid(alpha · gate), out = ((up + 1) · glu) @ down + b_down, weighted by the
      router's score and summed (alpha 1.702, limit swiglu_limit = 7)
  model.norm.weight, lm_head.weight [V, C] (gpt-oss does not tie it).
layer_types defaults to sliding on even layers, full on odd ones (GptOssConfig). The loss is the
token mean of cross entropy over labels != -100 (autosp's labels are already shifted).

Usage:
  gpt_oss_ref.py --dir HF_DIR --batch batch.safetensors --out out.safetensors [--grads]
      batch: input_ids, labels, position_ids [B, S] (i64), doc_start [B, S] optional;
      out: logits, loss, and grad.<name> of every parameter with --grads.
  gpt_oss_ref.py --selfcheck
      a tiny gpt-oss (GQA, windows that cut, packed documents, yarn, 4 experts of which 2 per token)
      written as an HF directory and read back: every gradient against float64 central finite
      differences, the sink attention against a loop over rows, the experts against HF's dense
      (inference) formulation, and the router against a per-token loop.
"""
import argparse
import json
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402
import torch_models  # noqa: E402  (rope only)

# GptOssConfig's defaults (configuration_gpt_oss.py).
DEFAULTS = {
    "num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088, "hidden_size": 2880,
    "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
    "sliding_window": 128, "rope_theta": 150000.0, "tie_word_embeddings": False,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 4096},
    "num_experts_per_tok": 4, "swiglu_limit": 7.0, "attention_bias": True, "layer_types": None,
}
ALPHA = 1.702


class Config:
    def __init__(self, d):
        c = dict(DEFAULTS)
        c.update({k: v for k, v in d.items() if v is not None or k == "layer_types"})
        for k in DEFAULTS:
            setattr(self, k, c[k])
        if self.tie_word_embeddings:
            raise ValueError("config.json: tie_word_embeddings true: gpt-oss's head is its own lm_head.weight")
        L = self.num_hidden_layers
        if self.layer_types is None:  # GptOssConfig: sliding where (i + 1) % 2 != 0
            self.layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
        if len(self.layer_types) != L or any(t not in ("sliding_attention", "full_attention") for t in self.layer_types):
            raise ValueError(f"config.json: layer_types {self.layer_types!r}: expected {L} of "
                             "\"sliding_attention\" / \"full_attention\"")


def param_shapes(cfg):
    V, C, N, Nkv, D = cfg.vocab_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    E, I = cfg.num_local_experts, cfg.intermediate_size
    s = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (C,)
        for proj, out in (("q", N * D), ("k", Nkv * D), ("v", Nkv * D)):
            s[p + f"self_attn.{proj}_proj.weight"] = (out, C)
            s[p + f"self_attn.{proj}_proj.bias"] = (out,)
        s[p + "self_attn.o_proj.weight"] = (C, N * D)
        s[p + "self_attn.o_proj.bias"] = (C,)
        s[p + "self_attn.sinks"] = (N,)
        s[p + "post_attention_layernorm.weight"] = (C,)
        s[p + "mlp.router.weight"] = (E, C)
        s[p + "mlp.router.bias"] = (E,)
        s[p + "mlp.experts.gate_up_proj"] = (E, C, 2 * I)
        s[p + "mlp.experts.gate_up_proj_bias"] = (E, 2 * I)
        s[p + "mlp.experts.down_proj"] = (E, I, C)
        s[p + "mlp.experts.down_proj_bias"] = (E, C)
    s["model.norm.weight"] = (C,)
    s["lm_head.weight"] = (V, C)
    return s


def load_dir(path, dtype=torch.float64):
    """(Config, params) from an HF directory, every tensor checked against the config's shapes."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = Config(json.load(f))
    index = os.path.join(path, "model.safetensors.index.json")
    files = [os.path.join(path, "model.safetensors")]
    if os.path.exists(index):
        with open(index) as f:
            files = sorted({os.path.join(path, v) for v in json.load(f)["weight_map"].values()})
    params = {}
    for fname in files:
        tensors, _ = safetensors_io.load(fname)
        params.update(tensors)
    want = param_shapes(cfg)
    for name, shape in want.items():
        if name not in params:
            raise ValueError(f"{path}: missing tensor '{name}' {list(shape)}")
        if tuple(params[name].shape) != shape:
            raise ValueError(f"{path}: tensor '{name}' has shape {list(params[name].shape)}, expected {list(shape)}")
    extra = sorted(set(params) - set(want))
    if extra:
        raise ValueError(f"{path}: tensor '{extra[0]}' is not a gpt-oss parameter")
    return cfg, {n: params[n].to(dtype) for n in want}


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def visible(S, window, doc_start):
    """bool [B or 1, S, S]: key j visible from query i."""
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    v = (j <= i)[None]
    if window is not None:
        v = v & (j > i - window)[None]
    if doc_start is not None:
        v = v & (j[None] >= doc_start[:, :, None])
    return v


def eager_attention(q, k, v, sinks, vis, scaling):
    """modeling_gpt_oss.py's eager_attention_forward: q [B, N, S, D], k, v [B, N, S, D] (repeated)."""
    w = torch.matmul(q, k.transpose(2, 3)) * scaling
    w = w + torch.zeros_like(w).masked_fill(~vis[:, None], torch.finfo(w.dtype).min)
    s = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], -1)
    combined = torch.cat([w, s], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined, dim=-1, dtype=combined.dtype)
    return torch.matmul(probs[..., :-1], v)


def router(cfg, p, pre, x, logits_out=None):
    """GptOssTopKRouter: x [T, C] -> scores [T, E] (softmax over the top-k logits, scattered), indices [T, k].
    logits_out: a list the router logits [T, E] (with the bias) are appended to (output_router_logits)."""
    logits = F.linear(x, p[pre + "mlp.router.weight"], p[pre + "mlp.router.bias"])
    if logits_out is not None:
        logits_out.append(logits)
    top, idx = torch.topk(logits, cfg.num_experts_per_tok, dim=-1)
    top = F.softmax(top, dim=1, dtype=top.dtype)
    return torch.zeros_like(logits).scatter_(1, idx, top), idx


def load_balancing_loss(router_logits, num_experts, top_k):
    """transformers' load_balancing_loss_func without an attention mask, on every layer's router
    logits [T, E] (GptOssForCausalLM adds router_aux_loss_coef times it to the loss): the softmax
    over all experts, each expert's share of the top-k slots and its mean probability, over the
    tokens of all layers together, summed and times E."""
    logits = torch.cat(router_logits, dim=0)
    weights = F.softmax(logits, dim=-1)
    _, selected = torch.topk(weights, top_k, dim=-1)
    mask = F.one_hot(selected, num_experts).to(weights.dtype)  # [T, k, E]
    return (mask.mean(dim=0) * weights.mean(dim=0)[None]).sum() * num_experts


def expert(cfg, p, pre, e, x):
    gate_up = x @ p[pre + "mlp.experts.gate_up_proj"][e] + p[pre + "mlp.experts.gate_up_proj_bias"][e]
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=cfg.swiglu_limit)
    up = up.clamp(min=-cfg.swiglu_limit, max=cfg.swiglu_limit)
    glu = gate * torch.sigmoid(gate * ALPHA)
    return ((up + 1) * glu) @ p[pre + "mlp.experts.down_proj"][e] + p[pre + "mlp.experts.down_proj_bias"][e]


def experts(cfg, p, pre, x, scores, idx):
    """GptOssExperts' training path: each selected expert on its tokens, weighted, index-added."""
    out = torch.zeros_like(x)
    for e in range(cfg.num_local_experts):
        tokens = (idx == e).any(dim=-1).nonzero().flatten()
        if tokens.numel() == 0:
            continue
        y = expert(cfg, p, pre, e, x[tokens]) * scores[tokens, e, None]
        out = out.index_add(0, tokens, y)
    return out


def experts_dense(cfg, p, pre, x, scores):
    """GptOssExperts' inference path: every expert on every token, weighted by the (mostly zero) scores."""
    E = cfg.num_local_experts
    h = x.repeat(E, 1).view(E, -1, x.shape[-1])
    gate_up = torch.bmm(h, p[pre + "mlp.experts.gate_up_proj"]) + p[pre + "mlp.experts.gate_up_proj_bias"][..., None, :]
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=cfg.swiglu_limit)
    up = up.clamp(min=-cfg.swiglu_limit, max=cfg.swiglu_limit)
    glu = gate * torch.sigmoid(gate * ALPHA)
    y = torch.bmm((up + 1) * glu, p[pre + "mlp.experts.down_proj"]) + p[pre + "mlp.experts.down_proj_bias"][..., None, :]
    return (y * scores.transpose(0, 1)[..., None]).sum(dim=0)


def forward(cfg, p, input_ids, position_ids, doc_start=None, router_logits=None):
    """logits [B, S, V] in the parameters' dtype; router_logits: a list that gets every layer's."""
    B, S = input_ids.shape
    N, Nkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    dt = p["model.embed_tokens.weight"].dtype
    cos, sin = torch_models.rope_cos_sin(position_ids, D, cfg.rope_theta, dt, cfg.rope_scaling,
                                         cfg.max_position_embeddings)
    x = p["model.embed_tokens.weight"][input_ids]
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."

        def linear(v, name):
            return F.linear(v, p[pre + name + ".weight"], p[pre + name + ".bias"])

        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = linear(h, "self_attn.q_proj").view(B, S, N, D).transpose(1, 2)
        k = linear(h, "self_attn.k_proj").view(B, S, Nkv, D).transpose(1, 2)
        v = linear(h, "self_attn.v_proj").view(B, S, Nkv, D).transpose(1, 2)
        q, k = torch_models.apply_rope(q, cos, sin), torch_models.apply_rope(k, cos, sin)
        k, v = torch_models.repeat_kv(k, N // Nkv), torch_models.repeat_kv(v, N // Nkv)
        window = cfg.sliding_window if cfg.layer_types[i] == "sliding_attention" else None
        o = eager_attention(q, k, v, p[pre + "self_attn.sinks"], visible(S, window, doc_start), D ** -0.5)
        x = x + linear(o.transpose(1, 2).reshape(B, S, N * D), "self_attn.o_proj")
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps).reshape(B * S, -1)
        scores, idx = router(cfg, p, pre, h, router_logits)
        x = x + experts(cfg, p, pre, h, scores, idx).view(B, S, -1)
    x = rms_norm(x, p["model.norm.weight"], eps)
    return F.linear(x, p["lm_head.weight"])


def loss_of(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def run(args):
    cfg, params = load_dir(args.dir)
    batch, _ = safetensors_io.load(args.batch)
    for t in params.values():
        t.requires_grad_(args.grads)
    logits = forward(cfg, params, batch["input_ids"], batch["position_ids"], batch.get("doc_start"))
    loss = loss_of(logits, batch["labels"])
    out = {"logits": logits.detach(), "loss": loss.detach().reshape(())}
    if args.grads:
        loss.backward()
        out.update({"grad." + n: t.grad for n, t in params.items()})
    safetensors_io.save(args.out, out)


# ---- the self-check ----

TINY = {"model_type": "gpt_oss", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 6, "head_dim": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "num_local_experts": 4,
        "num_experts_per_tok": 2, "sliding_window": 3, "max_position_embeddings": 64,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 8}}


def random_params(cfg, g):
    """float64 parameters of every shape: norms around 1, sinks around 0 with a real share, the rest 0.3 N(0, 1)."""
    params = {}
    for n, shape in param_shapes(cfg).items():
        if n.endswith("norm.weight"):
            params[n] = 1 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif n.endswith("sinks"):
            params[n] = torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            params[n] = 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
    return params


def tiny_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = Config(TINY)
    params = random_params(cfg, g)
    B, S = 2, 9
    ids = torch.randint(0, cfg.vocab_size, (B, S), generator=g)
    labels = torch.randint(0, cfg.vocab_size, (B, S), generator=g)
    labels[0, 2] = -100
    pos = torch.arange(S).repeat(B, 1)
    doc = torch.zeros(B, S, dtype=torch.int64)
    doc[1, 5:] = 5  # row 1: two documents, positions restarting at the second
    pos[1, 5:] -= 5
    return cfg, params, ids, labels, pos, doc


def selfcheck():
    cfg, params, ids, labels, pos, doc = tiny_case()
    with tempfile.TemporaryDirectory() as d:  # through the HF directory reader
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(TINY, f)
        safetensors_io.save(os.path.join(d, "model.safetensors"), params)
        cfg, loaded = load_dir(d)
        assert all(torch.equal(loaded[n], params[n]) for n in params)
    assert cfg.layer_types == ["sliding_attention", "full_attention"]

    # the sink attention against a loop over rows: softmax over the visible logits and the sink
    B, N, S, D = 2, 3, 7, 4
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, N, S, D, generator=g, dtype=torch.float64) for _ in range(3))
    sinks = torch.randn(N, generator=g, dtype=torch.float64)
    got = eager_attention(q, k, v, sinks, visible(S, 3, doc[:, :S]), 0.5)
    for b in range(B):
        for h in range(N):
            for i in range(S):
                keys = [j for j in range(S) if j <= i and j > i - 3 and j >= int(doc[b, i])]
                logits = torch.stack([0.5 * q[b, h, i] @ k[b, h, j] for j in keys])
                den = logits.exp().sum() + sinks[h].exp()
                want = sum((logits[n].exp() / den) * v[b, h, j] for n, j in enumerate(keys))
                assert torch.allclose(got[b, h, i], want, rtol=1e-12, atol=1e-14), (b, h, i)

    # experts: the training path against the dense one; the router against a per-token loop
    x = torch.randn(11, cfg.hidden_size, generator=g, dtype=torch.float64) * 3  # large enough to clamp
    pre = "model.layers.0."
    scores, idx = router(cfg, params, pre, x)
    for t in range(x.shape[0]):
        logits = params[pre + "mlp.router.weight"] @ x[t] + params[pre + "mlp.router.bias"]
        top = sorted(range(cfg.num_local_experts), key=lambda e: -float(logits[e]))[:cfg.num_experts_per_tok]
        w = torch.softmax(logits[top], dim=0)
        for e in range(cfg.num_local_experts):
            assert abs(float(scores[t, e]) - (float(w[top.index(e)]) if e in top else 0.0)) < 1e-14
    assert torch.allclose(experts(cfg, params, pre, x, scores, idx), experts_dense(cfg, params, pre, x, scores),
                          rtol=1e-12, atol=1e-12)
    # the load-balancing loss against counting by hand: E · Σ_e (top-k slots of e / (T·k) · k) · mean p_e
    got = load_balancing_loss([x @ params[pre + "mlp.router.weight"].t() + params[pre + "mlp.router.bias"]] * 2,
                              cfg.num_local_experts, cfg.num_experts_per_tok)
    probs = torch.softmax(x @ params[pre + "mlp.router.weight"].t() + params[pre + "mlp.router.bias"], dim=-1)
    want = 0.0
    for e in range(cfg.num_local_experts):
        slots = sum(e in sorted(range(cfg.num_local_experts), key=lambda j: -float(probs[t, j]))[:cfg.num_experts_per_tok]
                    for t in range(x.shape[0]))
        want += slots / x.shape[0] * float(probs[:, e].mean())
    assert abs(float(got) - cfg.num_local_experts * want) < 1e-12, (float(got), cfg.num_local_experts * want)

    # windows and documents really cut: without them the logits differ
    logits = forward(cfg, params, ids, pos, doc)
    full = Config(dict(TINY, layer_types=["full_attention"] * 2))
    assert not torch.allclose(logits, forward(full, params, ids, pos, doc))
    assert not torch.allclose(logits, forward(cfg, params, ids, pos, None))

    # every parameter's gradient against central finite differences (a few entries each)
    for t in params.values():
        t.requires_grad_(True)
    loss = loss_of(forward(cfg, params, ids, pos, doc), labels)
    loss.backward()
    eps, worst = 1e-6, 0.0
    with torch.no_grad():
        for n, t in params.items():
            flat = t.view(-1)
            for j in torch.randperm(flat.numel(), generator=g)[:3].tolist():
                old = float(flat[j])
                flat[j] = old + eps
                up = float(loss_of(forward(cfg, params, ids, pos, doc), labels))
                flat[j] = old - eps
                down = float(loss_of(forward(cfg, params, ids, pos, doc), labels))
                flat[j] = old
                fd, ad = (up - down) / (2 * eps), float(t.grad.view(-1)[j])
                err = abs(fd - ad) / max(1e-3, abs(fd))
                worst = max(worst, err)
                assert err < 1e-5, f"{n}[{j}]: autograd {ad} vs finite differences {fd}"
    print(f"gpt_oss_ref selfcheck ok: loss {float(loss):.6f}, worst gradient rel err {worst:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir")
    ap.add_argument("--batch")
    ap.add_argument("--out")
    ap.add_argument("--grads", action="store_true")
    ap.add_argument("--selfcheck", action="store_true")
    args = ap.parse_args()
    if args.selfcheck:
        return selfcheck()
    if not (args.dir and args.batch and args.out):
        ap.error("--dir, --batch and --out are required (or --selfcheck)")
    run(args)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
