"""The one Python implementation of autosp's models (GPT-2 and the Llama family: Llama, Mistral,
Qwen2, Qwen3, Hugging Face semantics), written with plain torch ops.  Used by tests/ref/model_ref.py (the reference for the C++ model)
and scripts/bench_pytorch.py (the PyTorch speed baseline).

Parameters are a dict of tensors keyed by *canonical* Hugging Face names:
  GPT-2: transformer.wte.weight [V,C], transformer.wpe.weight [P,C], transformer.h.{i}.ln_1.{weight,bias},
         transformer.h.{i}.attn.c_attn.{weight [C,3C], bias [3C]} (Conv1D: y = x @ W + b),
         transformer.h.{i}.attn.c_proj.{weight [C,C], bias}, transformer.h.{i}.ln_2.{weight,bias},
         transformer.h.{i}.mlp.c_fc.{weight [C,4C], bias}, transformer.h.{i}.mlp.c_proj.{weight [4C,C], bias},
         transformer.ln_f.{weight,bias}; the LM head is tied to wte.
  Llama: model.embed_tokens.weight [V,C], model.layers.{i}.input_layernorm.weight,
         model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (nn.Linear [out,in]: y = x @ W.T),
         model.layers.{i}.post_attention_layernorm.weight, model.layers.{i}.mlp.{gate,up,down}_proj.weight,
         model.norm.weight, lm_head.weight [V,C] (only when not tied).
  The Llama family, from the published modeling_<family>.py equations: llama's attention_bias
  (q/k/v/o_proj.bias) and mlp_bias (gate/up/down_proj.bias); mistral: none; qwen2: q/k/v_proj.bias;
  qwen3: attention_bias as llama's, and self_attn.{q,k}_norm.weight [D], an RMSNorm over each
  head's D of q and k before RoPE. head_dim (D) may differ from hidden_size / heads. rope_scaling
  linear, llama3 and yarn (transformers 5's _compute_yarn_parameters, written out below).
  qwen3_moe (modeling_qwen3_moe.py's Qwen3MoeSparseMoeBlock): Qwen3 whose sparse layers (every
  decoder_sparse_step-th, less mlp_only_layers) have mlp.gate.weight [E,C] and
  mlp.experts.{e}.{gate,up,down}_proj.weight; each token takes the top num_experts_per_tok of the
  router's softmax (renormalised when norm_topk_prob), experts in index order. transformers takes
  that softmax in float32 even for a float64 model; here it is in the working dtype.
  gemma2 (transformers 4.44's modeling_gemma2.py) and gemma3_text (modeling_gemma3.py's
  Gemma3ForCausalLM): RMSNorms times (1 + w) computed in float32 at least; norms before and after
  attention and MLP (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
  post_feedforward_layernorm); GeGLU with the tanh GELU; the embedding times sqrt(hidden) in the
  working dtype; attention scale query_pre_attn_scalar^-0.5; attention logits softcapped
  (attn_logit_softcapping) and final logits too (final_logit_softcapping); a tied head; layer i
  slides unless (i + 1) % sliding_window_pattern == 0 (or per layer_types). Gemma 3 adds q_norm /
  k_norm and rotates its sliding layers with rope_local_base_freq, unscaled.

Everything is computed in the dtype of the parameters (the "working dtype"); attention materialises
the S x S score matrix like Hugging Face's eager attention.
"""
import collections
import math

import torch
import torch.nn.functional as F


class ConfigError(ValueError):
    pass


_KNOWN_MODEL_KEYS = {"arch", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size", "max_position_embeddings", "rope_theta",
                     "norm_eps", "tie_word_embeddings", "head_dim", "attention_bias", "mlp_bias", "rope_scaling",
                     "sliding_window", "max_window_layers", "layer_types", "num_experts", "num_experts_per_tok",
                     "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                     "output_router_logits", "router_aux_loss_coef",
                     "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                     "sliding_window_pattern", "rope_local_base_freq", "attention_sinks"}
GEMMA = ("gemma2", "gemma3_text")
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe") + GEMMA


class ModelConfig:
    """The `model` object of an autosp config, with Hugging Face defaults filled in."""

    def __init__(self, d, warn=None):
        if not isinstance(d, dict):
            raise ConfigError("model: expected a JSON object")
        unknown = sorted(set(d) - _KNOWN_MODEL_KEYS)
        if unknown:
            raise ConfigError(f"model.{unknown[0]}: unknown key")
        arch = d.get("arch")
        if arch != "gpt2" and arch not in LLAMA_FAMILY:
            raise ConfigError(f"model.arch: expected \"gpt2\" or one of {LLAMA_FAMILY}, got {arch!r}")
        self.arch = arch

        def pos_int(key, default=None):
            v = d.get(key, default)
            if v is None:
                raise ConfigError(f"model.{key}: required for arch {arch}")
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"model.{key}: expected a positive integer, got {v!r}")
            return v

        def pos_float(key, default):
            v = d.get(key, default)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or not math.isfinite(v):
                raise ConfigError(f"model.{key}: expected a positive number, got {v!r}")
            return float(v)

        self.vocab_size = pos_int("vocab_size")
        self.hidden_size = pos_int("hidden_size")
        self.num_hidden_layers = pos_int("num_hidden_layers")
        self.num_attention_heads = pos_int("num_attention_heads")
        if "head_dim" in d and arch != "gpt2":
            self.head_dim = pos_int("head_dim")
        else:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(f"model.num_attention_heads: {self.num_attention_heads} does not divide "
                                  f"hidden_size {self.hidden_size}")
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.rope_scaling = None
        bias = bool(d.get("attention_bias", False))
        self.qkv_bias = {"llama": bias, "qwen3": bias, "qwen3_moe": bias, "qwen2": True}.get(arch, False)
        self.o_bias = {"llama": bias, "qwen3": bias, "qwen3_moe": bias}.get(arch, False)
        self.mlp_bias = arch == "llama" and bool(d.get("mlp_bias", False))
        self.qk_norm = arch in ("qwen3", "qwen3_moe", "gemma3_text")
        self.sinks = arch != "gpt2" and bool(d.get("attention_sinks", False))  # gpt-oss's, as autosp's model key
        self.gemma = arch in GEMMA
        self.attn_softcap = d.get("attn_logit_softcapping") if self.gemma else None
        self.final_softcap = d.get("final_logit_softcapping") if self.gemma else None
        self.query_pre_attn_scalar = d.get("query_pre_attn_scalar") if self.gemma else None
        self.rope_local_base_freq = d.get("rope_local_base_freq", 10000.0) if arch == "gemma3_text" else None
        moe = arch == "qwen3_moe"
        self.num_experts = pos_int("num_experts", 128) if moe else 0
        self.num_experts_per_tok = pos_int("num_experts_per_tok", 8) if moe else 0
        self.moe_intermediate_size = pos_int("moe_intermediate_size", 768) if moe else 0
        self.norm_topk_prob = bool(d.get("norm_topk_prob", False))
        self.decoder_sparse_step = pos_int("decoder_sparse_step", 1) if moe else 1
        self.mlp_only_layers = list(d.get("mlp_only_layers") or [])
        # the load-balancing loss (load_balancing_loss below), added by the caller
        self.output_router_logits = moe and bool(d.get("output_router_logits", False))
        self.router_aux_loss_coef = float(d.get("router_aux_loss_coef", 0.001))
        if arch == "gpt2":
            self.max_position_embeddings = pos_int("max_position_embeddings", 1024)
            self.num_key_value_heads = self.num_attention_heads
            self.intermediate_size = 4 * self.hidden_size
            self.norm_eps = pos_float("norm_eps", 1e-5)
            self.rope_theta = None
            if d.get("tie_word_embeddings", True) is not True and warn:
                warn("model.tie_word_embeddings: GPT-2 always ties the LM head to wte; ignored")
            self.tie_word_embeddings = True
            for k in ("num_key_value_heads", "intermediate_size", "rope_theta"):
                if k in d and warn:
                    warn(f"model.{k}: does not apply to arch gpt2; ignored")
        else:
            self.max_position_embeddings = pos_int("max_position_embeddings", 2048)
            self.num_key_value_heads = pos_int("num_key_value_heads", self.num_attention_heads)
            if self.num_attention_heads % self.num_key_value_heads:
                raise ConfigError(f"model.num_key_value_heads: {self.num_key_value_heads} does not divide "
                                  f"num_attention_heads {self.num_attention_heads}")
            self.intermediate_size = pos_int("intermediate_size")
            self.norm_eps = pos_float("norm_eps", 1e-6)
            self.rope_theta = pos_float("rope_theta", 10000.0)
            if self.head_dim % 2:
                raise ConfigError(f"model: head dim {self.head_dim} must be even for RoPE")
            t = d.get("tie_word_embeddings", self.gemma)  # Gemma's configs tie by default
            if not isinstance(t, bool):
                raise ConfigError(f"model.tie_word_embeddings: expected true or false, got {t!r}")
            self.tie_word_embeddings = t
            self.rope_scaling = d.get("rope_scaling")
            # The sliding window: transformers 4.44's eager mask hides key j from query i when
            # j <= i - sliding_window. Its layers: layer_types (transformers 5) when given, else every
            # Mistral layer and the Qwen layers i >= max_window_layers (Qwen2's flash-attention rule;
            # its default 28).
            self.sliding_window = d.get("sliding_window")
            types = d.get("layer_types")
            if self.sliding_window is None:
                self.layer_windows = [None] * self.num_hidden_layers
            elif types is not None:
                self.layer_windows = [self.sliding_window if t == "sliding_attention" else None for t in types]
            elif arch == "mistral":
                self.layer_windows = [self.sliding_window] * self.num_hidden_layers
            elif self.gemma:
                pattern = d.get("sliding_window_pattern", 6 if arch == "gemma3_text" else 2)
                self.layer_windows = [self.sliding_window if (i + 1) % pattern else None
                                      for i in range(self.num_hidden_layers)]
            else:
                first = d.get("max_window_layers", 28)
                self.layer_windows = [self.sliding_window if i >= first else None
                                      for i in range(self.num_hidden_layers)]

    def sparse(self, i):
        """Whether layer i's MLP is a mixture of experts (Qwen3MoeDecoderLayer's rule)."""
        return (self.num_experts > 0 and i not in self.mlp_only_layers
                and (i + 1) % self.decoder_sparse_step == 0)

    def as_dict(self):
        return {k: v for k, v in vars(self).items() if v is not None}


def param_shapes(cfg):
    """OrderedDict canonical name -> shape tuple, in Hugging Face order."""
    V, C, L = cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers
    s = collections.OrderedDict()
    if cfg.arch == "gpt2":
        s["transformer.wte.weight"] = (V, C)
        s["transformer.wpe.weight"] = (cfg.max_position_embeddings, C)
        for i in range(L):
            p = f"transformer.h.{i}."
            s[p + "ln_1.weight"] = (C,)
            s[p + "ln_1.bias"] = (C,)
            s[p + "attn.c_attn.weight"] = (C, 3 * C)
            s[p + "attn.c_attn.bias"] = (3 * C,)
            s[p + "attn.c_proj.weight"] = (C, C)
            s[p + "attn.c_proj.bias"] = (C,)
            s[p + "ln_2.weight"] = (C,)
            s[p + "ln_2.bias"] = (C,)
            s[p + "mlp.c_fc.weight"] = (C, 4 * C)
            s[p + "mlp.c_fc.bias"] = (4 * C,)
            s[p + "mlp.c_proj.weight"] = (4 * C, C)
            s[p + "mlp.c_proj.bias"] = (C,)
        s["transformer.ln_f.weight"] = (C,)
        s["transformer.ln_f.bias"] = (C,)
    else:
        N, Nkv, D, I = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
        s["model.embed_tokens.weight"] = (V, C)
        for i in range(L):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = (C,)
            for proj, out in (("q", N * D), ("k", Nkv * D), ("v", Nkv * D)):
                s[p + f"self_attn.{proj}_proj.weight"] = (out, C)
                if cfg.qkv_bias:
                    s[p + f"self_attn.{proj}_proj.bias"] = (out,)
            if cfg.qk_norm:
                s[p + "self_attn.q_norm.weight"] = (D,)
                s[p + "self_attn.k_norm.weight"] = (D,)
            s[p + "self_attn.o_proj.weight"] = (C, N * D)
            if cfg.sinks:
                s[p + "self_attn.sinks"] = (N,)
            if cfg.o_bias:
                s[p + "self_attn.o_proj.bias"] = (C,)
            s[p + "post_attention_layernorm.weight"] = (C,)
            if cfg.gemma:
                s[p + "pre_feedforward_layernorm.weight"] = (C,)
                s[p + "post_feedforward_layernorm.weight"] = (C,)
            if cfg.sparse(i):
                E, Ie = cfg.num_experts, cfg.moe_intermediate_size
                s[p + "mlp.gate.weight"] = (E, C)
                for e in range(E):
                    for proj, shape in (("gate", (Ie, C)), ("up", (Ie, C)), ("down", (C, Ie))):
                        s[p + f"mlp.experts.{e}.{proj}_proj.weight"] = shape
                continue
            for proj, shape in (("gate", (I, C)), ("up", (I, C)), ("down", (C, I))):
                s[p + f"mlp.{proj}_proj.weight"] = shape
                if cfg.mlp_bias:
                    s[p + f"mlp.{proj}_proj.bias"] = (shape[0],)
        s["model.norm.weight"] = (C,)
        if not cfg.tie_word_embeddings:
            s["lm_head.weight"] = (V, C)
    return s


def is_norm_weight(name):
    return any(t in name for t in ("ln_1.weight", "ln_2.weight", "ln_f.weight", "layernorm.weight",
                                   "model.norm.weight", "q_norm.weight", "k_norm.weight"))


def init_params(cfg, generator, dtype=torch.float32, std=0.02, norm_std=0.1, zero_bias=False):
    """Random parameters: N(0, std) for matrices/embeddings/biases, 1 + N(0, norm_std) for norm weights."""
    out = collections.OrderedDict()
    for name, shape in param_shapes(cfg).items():
        if is_norm_weight(name):
            t = 1.0 + norm_std * torch.randn(shape, generator=generator, dtype=torch.float64)
        elif name.endswith(".bias") and zero_bias:
            t = torch.zeros(shape, dtype=torch.float64)
        else:
            t = std * torch.randn(shape, generator=generator, dtype=torch.float64)
        out[name] = t.to(dtype)
    return out


# ---------------------------------------------------------------------------------------------------
# building blocks

def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def conv1d(x, w, b):
    """Hugging Face GPT-2 Conv1D: y = x @ W + b with W [in, out]."""
    shape = x.shape[:-1] + (w.shape[1],)
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(shape)


def rms_norm(x, w, eps):
    """LlamaRMSNorm, computed in the working dtype."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def gemma_rms_norm(x, w, eps):
    """Gemma2RMSNorm / Gemma3RMSNorm: in float32 (float64 stays float64), times (1 + w), cast back."""
    t = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.to(t)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + w.to(t))).to(x.dtype)


def causal_attention(q, k, v, mask=None, window=None, scale=None, softcap=None, sinks=None):
    """q, k, v [B, N, S, D] -> [B, N, S, D]; materialised causal softmax(q k^T · scale) v.
    mask: bool [B, S, S] (True = visible), used instead of the causal mask when given.
    window: keys j <= i - window are hidden from query i too (HF's sliding_window).
    scale: 1/sqrt(D) when None; softcap: scores become softcap · tanh(scores / softcap).
    sinks [N]: gpt-oss's eager_attention_forward (modeling_gpt_oss.py): the head's sink logit as one
    more column of every score row, the row's max subtracted, softmax, the column dropped."""
    S, D = q.shape[-2], q.shape[-1]
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(D) if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        visible = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    else:
        visible = mask[:, None]
    if window is not None:
        visible = visible & ~torch.ones(S, S, dtype=torch.bool, device=q.device).tril(diagonal=-window)
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    if sinks is not None:
        column = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], -1)
        combined = torch.cat([scores, column], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)[..., :-1]
        return torch.matmul(probs, v)
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v)


def rope_inv_freq(head_dim, theta, scaling, max_position_embeddings, dtype):
    """inv_freq [D/2] with Hugging Face's rope_scaling, and the factor cos and sin are scaled by."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim))
    t = (scaling or {}).get("rope_type", "default")
    if t == "default":
        return inv_freq, 1.0
    factor = scaling["factor"]
    if t == "linear":
        return inv_freq / factor, 1.0
    if t == "llama3":
        old, low, high = scaling["original_max_position_embeddings"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, blended, scaled), 1.0
    if t == "yarn":  # transformers 5: _compute_yarn_parameters
        orig = scaling.get("original_max_position_embeddings") or max_position_embeddings
        fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = scaling.get("attention_factor")
        if attention is None:
            m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
            attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

        def dim_of(rotations):
            return head_dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low, high = dim_of(fast), dim_of(slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(head_dim // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)
        return (inv_freq / factor) * ramp + inv_freq * (1 - ramp), attention
    raise ConfigError(f"model.rope_scaling: rope_type {t!r} is not in the reference")


def rope_cos_sin(position_ids, head_dim, theta, dtype, scaling=None, max_position_embeddings=None):
    """cos, sin [B, S, D] for rotate-half RoPE (Hugging Face Llama, computed in `dtype`)."""
    inv_freq, attention = rope_inv_freq(head_dim, theta, scaling, max_position_embeddings, dtype)
    freqs = position_ids[..., None].to(dtype) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * attention, emb.sin() * attention


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, cos, sin):
    """x [B, N, S, D]; cos/sin [B, S, D]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, rep):
    """[B, Nkv, S, D] -> [B, Nkv*rep, S, D]; head h uses kv head h // rep."""
    if rep == 1:
        return x
    B, Nkv, S, D = x.shape
    return x[:, :, None].expand(B, Nkv, rep, S, D).reshape(B, Nkv * rep, S, D)


# ---------------------------------------------------------------------------------------------------
# models

def document_batch(input_ids, labels, eos):
    """Packed documents, built by hand: a document ends with its EOS (which belongs to it).
    Returns (mask [B, S, S] bool: causal inside each document, position_ids restarting at 0 per
    document, labels with the EOS targets (the next document's first token) set to -100)."""
    B, S = input_ids.shape
    is_eos = input_ids == eos
    # doc[t] = number of EOS strictly before t
    doc = torch.cat([torch.zeros(B, 1, dtype=torch.int64), is_eos[:, :-1].to(torch.int64).cumsum(1)], dim=1)
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    mask = (doc[:, :, None] == doc[:, None, :]) & causal
    pos = torch.zeros(B, S, dtype=torch.int64)
    for b in range(B):
        first = 0
        for t in range(S):
            if t > 0 and bool(is_eos[b, t - 1]):
                first = t
            pos[b, t] = t - first
    labels = labels.clone()
    labels[is_eos] = -100
    return mask, pos, labels


def gpt2_layer(cfg, p, i, x, mask=None):
    """One GPT-2 block: x [B, S, C] -> [B, S, C]."""
    B, S, C = x.shape
    N, D, eps = cfg.num_attention_heads, cfg.head_dim, cfg.norm_eps
    pre = f"transformer.h.{i}."
    a = F.layer_norm(x, (C,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps)
    qkv = conv1d(a, p[pre + "attn.c_attn.weight"], p[pre + "attn.c_attn.bias"])
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, S, N, D).transpose(1, 2)
    k = k.view(B, S, N, D).transpose(1, 2)
    v = v.view(B, S, N, D).transpose(1, 2)
    o = causal_attention(q, k, v, mask).transpose(1, 2).reshape(B, S, C)
    x = x + conv1d(o, p[pre + "attn.c_proj.weight"], p[pre + "attn.c_proj.bias"])
    m = F.layer_norm(x, (C,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps)
    h = gelu_tanh(conv1d(m, p[pre + "mlp.c_fc.weight"], p[pre + "mlp.c_fc.bias"]))
    return x + conv1d(h, p[pre + "mlp.c_proj.weight"], p[pre + "mlp.c_proj.bias"])


def llama_layer(cfg, p, i, x, cos, sin, mask=None, router=None):
    """One Llama (or Gemma) decoder layer: x [B, S, C] -> [B, S, C]. cos, sin: Gemma 3's local
    layers take the second of a pair. router: a list the MoE layers append their router logits to."""
    B, S, _ = x.shape
    N, Nkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.norm_eps
    pre = f"model.layers.{i}."
    rms_norm = gemma_rms_norm if cfg.gemma else globals()["rms_norm"]
    if isinstance(cos, tuple):
        local = cfg.layer_windows[i] is not None
        cos, sin = cos[local], sin[local]

    def linear(v, name):
        return F.linear(v, p[pre + name + ".weight"], p.get(pre + name + ".bias"))

    def heads(v, H, norm=None):  # [B, S, H*D] -> [B, H, S, D], Qwen3's q_norm / k_norm over D first
        v = v.view(B, S, H, D)
        if norm is not None and cfg.qk_norm:
            v = rms_norm(v, p[pre + norm + ".weight"], eps)
        return v.transpose(1, 2)

    h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
    q = heads(linear(h, "self_attn.q_proj"), N, "self_attn.q_norm")
    k = heads(linear(h, "self_attn.k_proj"), Nkv, "self_attn.k_norm")
    v = heads(linear(h, "self_attn.v_proj"), Nkv)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    k = repeat_kv(k, N // Nkv)
    v = repeat_kv(v, N // Nkv)
    scale = cfg.query_pre_attn_scalar ** -0.5 if cfg.query_pre_attn_scalar else None
    o = causal_attention(q, k, v, mask, cfg.layer_windows[i], scale, cfg.attn_softcap,
                         p[pre + "self_attn.sinks"] if cfg.sinks else None)
    o = linear(o.transpose(1, 2).reshape(B, S, N * D), "self_attn.o_proj")
    if cfg.gemma:
        x = x + rms_norm(o, p[pre + "post_attention_layernorm.weight"], eps)
        h = rms_norm(x, p[pre + "pre_feedforward_layernorm.weight"], eps)
        g = gelu_tanh(linear(h, "mlp.gate_proj")) * linear(h, "mlp.up_proj")
        return x + rms_norm(linear(g, "mlp.down_proj"), p[pre + "post_feedforward_layernorm.weight"], eps)
    x = x + o
    h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
    if cfg.sparse(i):
        return x + sparse_moe_block(cfg, p, pre, h, router)
    g = F.silu(linear(h, "mlp.gate_proj")) * linear(h, "mlp.up_proj")
    return x + linear(g, "mlp.down_proj")


def sparse_moe_block(cfg, p, pre, h, router=None):
    """Qwen3MoeSparseMoeBlock.forward on h [B, S, C], transcribed (softmax in the working dtype);
    appends the router's probabilities [B·S, E] to the list `router` when one is given."""
    B, S, C = h.shape
    hidden = h.reshape(-1, C)
    probs = F.softmax(F.linear(hidden, p[pre + "mlp.gate.weight"]), dim=1)
    if router is not None:
        router.append(probs)
    weights, selected = torch.topk(probs, cfg.num_experts_per_tok, dim=-1)
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(hidden)
    mask = F.one_hot(selected, num_classes=cfg.num_experts).permute(2, 1, 0)
    for e in range(cfg.num_experts):
        idx, top_x = torch.where(mask[e])
        x_e = hidden[top_x]
        w = lambda proj: p[pre + f"mlp.experts.{e}.{proj}_proj.weight"]  # noqa: E731
        y_e = F.linear(F.silu(F.linear(x_e, w("gate"))) * F.linear(x_e, w("up")), w("down"))
        out = out.index_add(0, top_x, y_e * weights[top_x, idx, None])
    return out.reshape(B, S, C)


def _run_layer(checkpoint, layer, *args):
    """layer(*args), or under activation checkpointing: only the layer's input is kept and the
    layer is recomputed in the backward (torch.utils.checkpoint, non-reentrant, as Hugging Face's
    gradient_checkpointing_enable() does per decoder layer)."""
    if not checkpoint:
        return layer(*args)
    from torch.utils.checkpoint import checkpoint as ckpt
    return ckpt(layer, *args, use_reentrant=False)


def gpt2_forward(cfg, p, input_ids, position_ids, mask=None, checkpoint=False):
    C, eps = cfg.hidden_size, cfg.norm_eps
    wte = p["transformer.wte.weight"]
    x = F.embedding(input_ids, wte) + F.embedding(position_ids, p["transformer.wpe.weight"])
    for i in range(cfg.num_hidden_layers):
        x = _run_layer(checkpoint, lambda x, i=i: gpt2_layer(cfg, p, i, x, mask), x)
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    return F.linear(x, wte)


def llama_forward(cfg, p, input_ids, position_ids, mask=None, checkpoint=False, router=None):
    emb = p["model.embed_tokens.weight"]
    x = F.embedding(input_ids, emb)
    if cfg.gemma:  # the normalizer is a tensor of the working dtype
        x = x * torch.tensor(cfg.hidden_size ** 0.5, dtype=x.dtype)
    cos, sin = rope_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta, x.dtype, cfg.rope_scaling,
                            cfg.max_position_embeddings)
    if cfg.rope_local_base_freq is not None:  # Gemma 3: (global, local) pairs
        lcos, lsin = rope_cos_sin(position_ids, cfg.head_dim, cfg.rope_local_base_freq, x.dtype)
        cos, sin = (cos, lcos), (sin, lsin)
    for i in range(cfg.num_hidden_layers):
        x = _run_layer(checkpoint, lambda x, i=i: llama_layer(cfg, p, i, x, cos, sin, mask, router), x)
    x = (gemma_rms_norm if cfg.gemma else rms_norm)(x, p["model.norm.weight"], cfg.norm_eps)
    head = emb if cfg.tie_word_embeddings else p["lm_head.weight"]
    logits = F.linear(x, head)
    if cfg.final_softcap:
        logits = torch.tanh(logits / cfg.final_softcap) * cfg.final_softcap
    return logits


def forward(cfg, params, input_ids, position_ids, mask=None, checkpoint=False, router=None):
    """logits [B, S, V] in the parameters' dtype; mask: see causal_attention; checkpoint: recompute
    each layer in the backward instead of keeping its activations; router: a list that gets each
    sparse layer's router probabilities (load_balancing_loss)."""
    if cfg.arch == "gpt2":
        return gpt2_forward(cfg, params, input_ids, position_ids, mask, checkpoint)
    return llama_forward(cfg, params, input_ids, position_ids, mask, checkpoint, router)


def load_balancing_loss(router_probs, num_experts, top_k):
    """transformers' load_balancing_loss_func without an attention mask, written from its
    definition (Switch Transformer eq. 4-6): the layers' router probabilities concatenated
    [L·T, E]; E · Σ (each top-k slot's share of the rows on each expert) · (each expert's mean
    probability). Every token counts; the labels never enter."""
    probs = torch.cat(router_probs, 0)
    chosen = torch.topk(probs, top_k, dim=-1).indices
    tokens_per_expert = F.one_hot(chosen, num_experts).to(probs.dtype).mean(0)  # [k, E]
    return num_experts * (tokens_per_expert * probs.mean(0)).sum()


def token_loss(logits, labels):
    """Returns (loss, loss_sum, valid_count): mean cross-entropy over labels != -100.
    Labels are already shifted by the data loader; nothing is shifted here."""
    V = logits.shape[-1]
    loss_sum = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100, reduction="sum")
    valid = (labels != -100).sum()
    return loss_sum / valid.to(logits.dtype), loss_sum, valid
