#!/usr/bin/python3
"""PyTorch speed baseline for autosp-bench (same model code as tests/ref/model_ref.py).

  PYTHON scripts/bench_pytorch.py [--config CFG.json] [--arch gpt2|llama] [--layers L]
      [--hidden C] [--heads N] [--kv-heads Nkv] [--intermediate I] [--vocab V] [--batch B] [--seq S]
      [--threads T] [--mode forward|step] [--warmup W] [--iters I] [--seed K] [--tie | --no-tie]
      [--attention sdpa|math] [--compile] [--[no-]checkpoint] [--clip X] [--dtype float32|bfloat16] [--serve]

PYTHON is a current PyTorch 2.x (scripts/pytorch-venv.sh prints the venv's python) or Debian's
python3-torch 1.13 (/usr/bin/python3).

The model comes from an autosp config (its "model" object; data.batch_size / data.seq_len /
runtime.threads / train.{lr,weight_decay,beta1,beta2,eps} are used when present), and flags override
it. Without --config the defaults are GPT-2, 4 layers, hidden 256, 8 heads, vocab 512, batch 4,
seq 256. Llama's intermediate size defaults to 4*hidden when neither the config nor a flag gives it.

float32 parameters, random init (N(0, 0.02)), one fixed random batch (labels = the next token).
--dtype bfloat16 (the default where the config's runtime.dtype is "bfloat16") runs the forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's mixed precision as a user turns it on: the
linear layers, matmuls and SDPA in bf16 (oneDNN's bf16 kernels: AMX or AVX512-BF16 where the CPU
has them), f32 master weights and AdamW state, the loss and norms where autocast keeps them, f32.
  forward: logits + mean cross-entropy under torch.no_grad()
  step:    forward + loss.backward() + clip_grad_norm_(--clip, default the config's train.grad_clip,
           else 1.0, autosp's default; 0 = none) + torch.optim.AdamW.step() (decay only on tensors
           of rank >= 2), gradients set to None before each step.
Attention (--attention): "sdpa" (the default where torch has it, 2.x) is
torch.nn.functional.scaled_dot_product_attention(is_causal=True), PyTorch's flash kernel on CPU,
like Hugging Face's sdpa attention (K, V repeated over the GQA group first); "math" (the default
on 1.13) is the materialised causal softmax(QK^T/sqrt(D))V of Hugging Face eager.
--checkpoint recomputes each layer in the backward (torch.utils.checkpoint, non-reentrant, per
decoder layer, as Hugging Face's gradient_checkpointing_enable() does); the default is the config's
runtime.activation_checkpointing, as autosp reads it.
--compile wraps the forward and loss in torch.compile (Inductor; its backward is compiled too,
the optimizer stays eager); compilation happens in the warm-up and is not timed.
--serve: set up once, print {"ready": true, "torch": ...}, then answer each stdin line
{"warmup": W, "iters": I} with a result line like the one below, so that autosp-bench can
alternate with it (peak_bytes there is over everything since the setup).

Prints one JSON line: {"impl": "pytorch", "mode", "tokens_per_sec", "step_ms" (median), "peak_bytes",
"peak_rss_bytes", ...config and timing details,
loadavg_1m at the end: a busy machine makes the numbers meaningless}. tokens_per_sec = batch*seq / median step time.

Memory (CPU): peak_bytes is the resident-set high-water mark during the warm-up and timed iterations
minus the resident set just before them, i.e. after the model, its parameters, the optimizer object
and the batch exist (the high-water mark is reset there by writing 5 to /proc/self/clear_refs, so an
earlier peak, e.g. from importing torch, does not count). It covers everything the steps add:
activations (with --attention math the materialised S x S attention), gradients, AdamW's state
(created by the first step), allocator slack and, with --compile, what compiling the graphs keeps. peak_method says whether the reset worked ("rss_hwm_delta") or the
delta is over the process's lifetime peak ("rss_hwm_delta_unreset", an upper bound).
peak_rss_bytes is the process's lifetime peak RSS (interpreter and torch included).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tests", "ref"))

import torch  # noqa: E402

import torch_models as tm  # noqa: E402


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def proc_status_bytes(field):
    """A field of /proc/self/status (VmRSS, VmHWM) in bytes; 0 where unavailable."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_baseline():
    """The current RSS, with the kernel's high-water mark reset to it when /proc allows."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    return proc_status_bytes("VmRSS"), reset


def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch eager baseline for autosp-bench")
    ap.add_argument("--config")
    ap.add_argument("--arch", choices=["gpt2", "llama", "mistral", "qwen2", "qwen3"])
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--mode", choices=["forward", "step"], default="step")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tie", action=argparse.BooleanOptionalAction, default=None,
                    help="Llama: tie the LM head to the embedding (default: the config's, else untied)")
    has_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    ap.add_argument("--attention", choices=["sdpa", "math"], default="sdpa" if has_sdpa else "math")
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward and loss")
    ap.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=None,
                    help="activation checkpointing per layer (default: the config's "
                         "runtime.activation_checkpointing, else off)")
    ap.add_argument("--clip", type=float, help="gradient clipping max norm (0: none)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"],
                    help="bfloat16: forward and loss under torch.autocast (default: the config's runtime.dtype)")
    ap.add_argument("--serve", action="store_true", help="answer {warmup, iters} requests on stdin")
    args = ap.parse_args(argv)
    if args.attention == "sdpa" and not has_sdpa:
        fail(f"--attention sdpa: torch {torch.__version__} has no scaled_dot_product_attention")
    if args.compile and not hasattr(torch, "compile"):
        fail(f"--compile: torch {torch.__version__} has no torch.compile")

    doc = {}
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"{args.config}: {e}")
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            fail(f"{args.config}: no \"model\" object")
    model = dict(doc.get("model") or {"arch": "gpt2", "num_hidden_layers": 4, "hidden_size": 256,
                                      "num_attention_heads": 8, "vocab_size": 512})
    data = doc.get("data") or {}
    train = doc.get("train") or {}
    runtime = doc.get("runtime") or {}
    for flag, key in (("arch", "arch"), ("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                      ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"),
                      ("intermediate", "intermediate_size"), ("vocab", "vocab_size")):
        if getattr(args, flag) is not None:
            model[key] = getattr(args, flag)
    if args.tie is not None and model.get("arch") in tm.LLAMA_FAMILY:
        model["tie_word_embeddings"] = args.tie
    arch = model.get("arch")
    if arch == "gpt2":
        for k in ("num_key_value_heads", "intermediate_size", "rope_theta"):
            model.pop(k, None)
    elif arch in tm.LLAMA_FAMILY and "intermediate_size" not in model and isinstance(model.get("hidden_size"), int):
        model["intermediate_size"] = 4 * model["hidden_size"]
    B = args.batch or data.get("batch_size") or 4
    S = args.seq or data.get("seq_len") or 256
    model["max_position_embeddings"] = max(S, model.get("max_position_embeddings") or 0)
    try:
        cfg = tm.ModelConfig(model)
    except tm.ConfigError as e:
        fail(str(e))
    if B <= 0 or S <= 0 or args.iters <= 0 or args.warmup < 0:
        fail("--batch, --seq and --iters must be positive, --warmup non-negative")
    threads = args.threads or runtime.get("threads")
    if threads:
        torch.set_num_threads(int(threads))

    if args.attention == "sdpa":
        sdpa = torch.nn.functional.scaled_dot_product_attention
        materialised = tm.causal_attention

        # torch_models.causal_attention(q, k, v, mask=None, window=None, scale=None, softcap=None,
        # ...): mask [B, S, S] (True = visible) or causal; a sliding window, a softcap or any variant
        # argument added there later keeps the materialised reference (SDPA takes none of them).
        def sdpa_attention(q, k, v, mask=None, window=None, scale=None, *rest, **variant):
            if window is not None or any(x is not None for x in rest) or any(x is not None for x in variant.values()):
                return materialised(q, k, v, mask, window, scale, *rest, **variant)
            if mask is None:
                return sdpa(q, k, v, is_causal=True, scale=scale)
            return sdpa(q, k, v, attn_mask=mask[:, None], scale=scale)
        tm.causal_attention = sdpa_attention
    clip = args.clip if args.clip is not None else float(train.get("grad_clip", 1.0))
    checkpoint = bool(runtime.get("activation_checkpointing", False)) if args.checkpoint is None else args.checkpoint

    g = torch.Generator().manual_seed(args.seed)
    params = tm.init_params(cfg, g, dtype=torch.float32, zero_bias=True, norm_std=0.0)
    tokens = torch.randint(0, cfg.vocab_size, (B, S + 1), generator=g)
    ids, labels = tokens[:, :S].contiguous(), tokens[:, 1:].contiguous()
    pos = torch.arange(S).expand(B, S).contiguous()
    n_params = sum(p.numel() for p in params.values())

    # The config's runtime.dtype: bfloat16 is autocast; float32 and float64 run the float32 baseline.
    dtype = args.dtype or ("bfloat16" if runtime.get("dtype") == "bfloat16" else "float32")

    def model_loss():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            return tm.token_loss(tm.forward(cfg, params, ids, pos, checkpoint=checkpoint and args.mode == "step"),
                                 labels)[0]

    if args.compile:
        model_loss = torch.compile(model_loss)

    if args.mode == "step":
        for p in params.values():
            p.requires_grad_(True)
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": float(train.get("weight_decay", 0.1))},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=float(train.get("lr", 3e-4)), betas=(float(train.get("beta1", 0.9)), float(train.get("beta2", 0.95))),
            eps=float(train.get("eps", 1e-8)))

        all_params = list(params.values())

        def one():
            opt.zero_grad(set_to_none=True)
            loss = model_loss()
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(all_params, clip)
            opt.step()
            return loss
    else:
        def one():
            with torch.no_grad():
                return model_loss()

    baseline, reset = rss_baseline()

    def run(warmup, iters):
        for _ in range(warmup):
            one()
        times = []
        loss = None
        for _ in range(iters):
            t0 = time.perf_counter()
            loss = one()
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        peak_delta = max(0, proc_status_bytes("VmHWM") - baseline)
        return {"impl": "pytorch", "mode": args.mode, "tokens_per_sec": B * S / med, "step_ms": med * 1e3,
                "peak_bytes": peak_delta, "peak_method": "rss_hwm_delta" if reset else "rss_hwm_delta_unreset",
                "peak_rss_bytes": peak, "step_ms_min": min(times) * 1e3, "iters": iters, "warmup": warmup,
                "arch": cfg.arch, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                "intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size, "batch": B, "seq": S,
                "params": n_params, "threads": torch.get_num_threads(), "dtype": dtype,
                "attention": args.attention, "compile": args.compile, "clip": clip,
                "checkpoint": checkpoint,
                "final_loss": float(loss.detach()), "torch": torch.__version__,
                "loadavg_1m": os.getloadavg()[0], "cpus": os.cpu_count()}

    if not args.serve:
        print(json.dumps(run(args.warmup, args.iters)))
        return 0
    print(json.dumps({"ready": True, "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        print(json.dumps(run(int(req.get("warmup", 0)), int(req.get("iters", 1)))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
