#!/usr/bin/python3
"""gpt-oss trained by autosp against the float64 transcription of transformers' modeling_gpt_oss.py
(tests/ref/gpt_oss_ref.py), and under sequence parallelism. Needs only /usr/bin/python3 (torch):
transformers 4.44 has no gpt-oss.

A tiny gpt-oss (GQA, 4 experts of which 2 per token, swiglu_limit 1.5 so that the clamps bite,
yarn, windows of 4 on layer 0 over sequences of 16: the window cuts four times) is written as a
Hugging Face directory in transformers' layout (stacked, interleaved experts); then
  1. autosp-train with model.from in float64 has the reference's loss at step 1 and, by
     --dump-grads, its gradient of every parameter (the reference's stacked expert gradients
     split here by modeling_gpt_oss.py's layout: gate = gate_up[..., 0::2], up = [..., 1::2], x @ W);
     with model.sliding_window null (full attention), or a swiglu_limit that never clamps, the loss
     differs;
     with the experts split over 2 ranks (moe.expert_parallel_size 2) under Ulysses 2 the same;
  2. its checkpoint after step 1 loads in the reference's loader (exactly gpt-oss's tensors and
     config.json), whose loss on step 2's tokens is autosp's at step 2;
  3. with packed documents (data.document_mask: positions restart, attention stays in the document,
     an EOS's target is ignored) P = 1 equals the reference, and P = 2 (Ulysses), 4 (ring of 4),
     4 (Ulysses 2 x ring 2) and dp 2 x sp 2 equal P = 1 (loss and every gradient within 1e-10);
  4. with output_router_logits (router_aux_loss_coef 0.05) the loss, moe/aux_loss and every gradient
     equal the reference's, which adds transformers' load_balancing_loss_func over the router
     logits (with the bias), at P = 1, Ulysses 2 and a ring of 2;
  5. the same weights as the hub stores them (experts as MXFP4 blocks and scales, quantization_config
     mxfp4) train from model.from with the loss of the reference on the dequantized weights, which
     this script computes by its own transcription of transformers' convert_moe_packed_tensors.
Tolerances as ref.hf_gemma's (loss 1e-6 relative, gradients 1e-5 of the largest); measured far below.
  gpt_oss_family.py BIN_DIR
"""
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_oss_ref as ref  # noqa: E402
import safetensors_io  # noqa: E402
from hf_common import compare_grads, launch, train_config, write_tokens  # noqa: E402

VOCAB, SEQ, BATCH, WINDOW = 64, 16, 2, 4
CONFIG = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "vocab_size": VOCAB, "hidden_size": 32,
          "intermediate_size": 32, "head_dim": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW,
          "max_position_embeddings": 128, "swiglu_limit": 1.5, "attention_bias": True, "tie_word_embeddings": False,
          "rms_norm_eps": 1e-5, "rope_theta": 500.0,
          "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                           "truncate": False, "original_max_position_embeddings": 16}}
# (ranks, autosp_size, ring_size): P = 1 first
LAYOUTS = ((1, 1, 1), (2, 2, 1), (4, 4, 4), (4, 4, 2), (4, 2, 1))
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def write_dir(path, config, tensors):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    safetensors_io.save(os.path.join(path, "model.safetensors"), tensors)


def batch(tokens, step, docs=False, batch_size=BATCH, eos=None):
    """The reference's inputs of 0-based step `step` (the llm.c order; data.h's packed documents: a
    document ends with its EOS, positions restart after it, an EOS's target is ignored)."""
    rows = [[tokens[((step * batch_size + b) * SEQ + i) % len(tokens)] for i in range(SEQ + 1)] for b in range(batch_size)]
    x = torch.tensor(rows, dtype=torch.int64)
    ids, labels = x[:, :-1], x[:, 1:].clone()
    pos = torch.arange(SEQ).repeat(batch_size, 1)
    doc = torch.zeros(batch_size, SEQ, dtype=torch.int64)
    if docs:
        for b in range(batch_size):
            start = 0
            for t in range(SEQ):
                doc[b, t], pos[b, t] = start, t - start
                if int(ids[b, t]) == eos:
                    labels[b, t] = -100
                    start = t + 1
    return ids, labels, pos, doc if docs else None


def reference(cfg, params, tokens, step, docs=None, grads=False, batch_size=BATCH, aux_coef=None):
    """The loss (with aux_coef: plus aux_coef x the load-balancing loss, as GptOssForCausalLM adds it
    when output_router_logits), per-expert gradients with `grads`, and the load-balancing loss."""
    p = {n: t.clone().requires_grad_(grads) for n, t in params.items()}
    ids, labels, pos, doc = batch(tokens, step, docs is not None, batch_size, docs)
    router_logits = []
    loss = ref.loss_of(ref.forward(cfg, p, ids, pos, doc, router_logits), labels)
    aux = ref.load_balancing_loss(router_logits, cfg.num_local_experts, cfg.num_experts_per_tok)
    if aux_coef is not None:
        loss = loss + aux_coef * aux
    if not grads:
        return loss.item(), None
    loss.backward()
    return loss.item(), per_expert({n: t.grad for n, t in p.items()}, cfg), aux.item()


def per_expert(tensors, cfg):
    """transformers' stacked expert tensors as autosp's per-expert ones (nn.Linear layout)."""
    out = {}
    for n, t in tensors.items():
        pre, _, leaf = n.rpartition("mlp.experts.")
        if not pre:
            out[n] = t
            continue
        for e in range(cfg.num_local_experts):
            q = f"{pre}mlp.experts.{e}."
            if leaf == "gate_up_proj":
                out[q + "gate_proj.weight"] = t[e][:, 0::2].t()
                out[q + "up_proj.weight"] = t[e][:, 1::2].t()
            elif leaf == "gate_up_proj_bias":
                out[q + "gate_proj.bias"] = t[e][0::2]
                out[q + "up_proj.bias"] = t[e][1::2]
            elif leaf == "down_proj":
                out[q + "down_proj.weight"] = t[e].t()
            else:
                out[q + "down_proj.bias"] = t[e]
    return out


def run(bin_dir, work, config, ranks=1, extra=(), name="run"):
    cfg_path, metrics = os.path.join(work, f"{name}.json"), os.path.join(work, f"{name}.metrics.jsonl")
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    launch([os.path.join(bin_dir, "autosp-train"), "--config", cfg_path, "--metrics", metrics, "--quiet", *extra], ranks)
    with open(metrics) as f:
        return [json.loads(line) for line in f if line.strip()]


def config(work, src, steps=1, batch_size=BATCH, **more):
    return train_config(work, src, SEQ, batch_size, steps, **more)


def check(what, ours, theirs, rel=1e-6):
    diff = abs(ours - theirs)
    print(f"{what}: autosp {ours:.12f}, reference {theirs:.12f}, |diff| {diff:.2e}")
    assert diff <= rel * abs(theirs), f"{what}: {ours} vs {theirs}"


def compare_grad_file(what, path, theirs, rel):
    """--dump-grads' file against `theirs`; returns it."""
    ours = {n: t.to(torch.float64) for n, t in safetensors_io.load(path)[0].items()}
    compare_grads(what, ours, theirs, rel)
    return ours


def mxfp4(weight, g):
    """An [E, K, rows] expert tensor (x @ W) whose values MXFP4 holds exactly: its blocks
    [E, rows, K / 32, 16] and scales [E, rows, K / 32] as the hub stores them, and the weight they
    dequantize to by transformers' convert_moe_packed_tensors, transcribed: nibble j of a byte is
    element 2j (low) or 2j + 1 (high) of its block, FP4[nibble] * 2^(scale - 127), [E, rows, K]
    transposed to [E, K, rows]."""
    E, K, rows = weight.shape
    blocks = torch.randint(0, 256, (E, rows, K // 32, 16), generator=g, dtype=torch.int64)
    scales = torch.randint(118, 124, (E, rows, K // 32), generator=g, dtype=torch.int64)
    lut = torch.tensor(FP4, dtype=torch.float64)
    out = torch.empty(E, rows, K // 32, 32, dtype=torch.float64)
    out[..., 0::2] = lut[blocks & 15]
    out[..., 1::2] = lut[blocks >> 4]
    out = out * torch.pow(2.0, (scales - 127).to(torch.float64))[..., None]
    return blocks.to(torch.uint8), scales.to(torch.uint8), out.reshape(E, rows, K).transpose(1, 2).contiguous()


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="autosp-gpt-oss-")
    try:
        tokens = write_tokens(os.path.join(work, "tokens.bin"), 4096, VOCAB)
        cfg = ref.Config(CONFIG)
        assert cfg.layer_types == ["sliding_attention", "full_attention"]
        params = ref.random_params(cfg, torch.Generator().manual_seed(0))
        src = os.path.join(work, "gpt_oss")
        write_dir(src, CONFIG, params)

        # 1. loss and every gradient at P = 1; full attention differs
        loss, theirs, _ = reference(cfg, params, tokens, 0, grads=True)
        grads, ckpt = os.path.join(work, "grads.safetensors"), os.path.join(work, "ckpt")
        m = run(bin_dir, work, config(work, src, steps=2, train={"checkpoint_dir": ckpt, "checkpoint_every": 1,
                                                                   "keep_checkpoints": 0}),
                extra=["--dump-grads", grads], name="p1")
        check("gpt-oss step 1 (model.from)", m[0]["loss"], loss)
        compare_grad_file("gpt-oss step 1 gradients", grads, theirs, 1e-5)
        full = run(bin_dir, work, config(work, src, model={"sliding_window": None}), name="full")[0]["loss"]
        print(f"gpt-oss with full causal attention: {full:.12f}")
        assert abs(full - loss) > 1e-4, "the window does not change the loss"
        unclamped = run(bin_dir, work, config(work, src, model={"swiglu_limit": 100.0}), name="unclamped")[0]["loss"]
        print(f"gpt-oss with swiglu_limit 100 (no clamp bites): {unclamped:.12f}")
        assert abs(unclamped - loss) > 1e-4, "the clamps do not change the loss"

        # expert parallelism (each of 2 ranks holds 2 experts, their biases with them) under Ulysses 2
        ep_grads = os.path.join(work, "grads-ep.safetensors")
        ep = run(bin_dir, work, config(work, src, sequence_parallel={"autosp_size": 2}, moe={"expert_parallel_size": 2}),
                 2, extra=["--dump-grads", ep_grads], name="ep")[0]["loss"]
        check("gpt-oss, 2 ranks: Ulysses 2, experts split over 2", ep, loss)
        compare_grad_file("gpt-oss, 2 ranks: Ulysses 2, experts split over 2", ep_grads, theirs, 1e-5)

        # 2. the checkpoint in the reference's loader: exactly gpt-oss's tensors, step 2's loss
        back_cfg, back = ref.load_dir(os.path.join(ckpt, "step_00000001"))
        check("gpt-oss checkpoint of step 1 in the reference, at step 2", m[1]["loss"],
              reference(back_cfg, back, tokens, 1)[0])

        # 3. packed documents: P = 1 against the reference, P > 1 against P = 1
        eos = int(torch.tensor(tokens[:2 * BATCH * SEQ]).bincount().argmax())  # a frequent token: short documents
        loss_docs, theirs_docs, _ = reference(cfg, params, tokens, 0, docs=eos, grads=True, batch_size=2 * BATCH)
        base = None
        for ranks, sp, ring in LAYOUTS:
            dp = ranks // sp
            path = os.path.join(work, f"grads-docs-{ranks}-{sp}-{ring}.safetensors")
            c = config(work, src, batch_size=2 * BATCH // dp, data={"document_mask": True, "eos_token_id": eos},
                       sequence_parallel={"autosp_size": sp, "ring_size": ring})
            got = run(bin_dir, work, c, ranks, extra=["--dump-grads", path], name=f"docs-{ranks}-{sp}-{ring}")[0]["loss"]
            what = f"gpt-oss packed documents, {ranks} ranks: dp {dp} x Ulysses {sp // ring} x ring {ring}"
            if base is None:
                check(what + " (against the reference)", got, loss_docs)
                base = (got, compare_grad_file(what + " (against the reference)", path, theirs_docs, 1e-5))
                continue
            check(what + " (against P = 1)", got, base[0], 1e-10)
            compare_grad_file(what + " (against P = 1)", path, base[1], 1e-10)

        # 4. the load-balancing loss (output_router_logits): the loss, the aux loss and every gradient
        # at P = 1, and under Ulysses and the ring (the router statistics reduced over the SP group)
        coef = 0.05
        loss_aux, theirs_aux, aux = reference(cfg, params, tokens, 0, grads=True, aux_coef=coef)
        for ranks, sp, ring in ((1, 1, 1), (2, 2, 1), (2, 2, 2)):
            path = os.path.join(work, f"grads-aux-{ranks}-{ring}.safetensors")
            c = config(work, src, model={"output_router_logits": True, "router_aux_loss_coef": coef},
                       sequence_parallel={"autosp_size": sp, "ring_size": ring})
            got = run(bin_dir, work, c, ranks, extra=["--dump-grads", path], name=f"aux-{ranks}-{ring}")[0]
            what = f"gpt-oss with output_router_logits, {ranks} ranks, ring {ring}"
            check(what + ": loss", got["loss"], loss_aux)
            check(what + ": moe/aux_loss", got["moe/aux_loss"], aux)
            compare_grad_file(what, path, theirs_aux, 1e-5)

        # 5. the hub's MXFP4 experts: dequantized on load, trained
        g = torch.Generator().manual_seed(7)
        hub, dequantized = dict(params), dict(params)
        for layer in range(cfg.num_hidden_layers):
            for proj in ("gate_up_proj", "down_proj"):
                name = f"model.layers.{layer}.mlp.experts.{proj}"
                blocks, scales, w = mxfp4(params[name], g)
                del hub[name]
                hub[name + "_blocks"], hub[name + "_scales"], dequantized[name] = blocks, scales, w
        quantized = os.path.join(work, "gpt_oss_mxfp4")
        write_dir(quantized, dict(CONFIG, quantization_config={"quant_method": "mxfp4", "modules_to_not_convert":
                                                               ["model.layers.*.self_attn", "lm_head"]}), hub)
        got = run(bin_dir, work, config(work, quantized), name="mxfp4")[0]["loss"]
        check("gpt-oss from MXFP4 experts (step 1)", got, reference(cfg, dequantized, tokens, 0)[0])
        print("gpt-oss family: ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
