#!/usr/bin/env python3
"""Hugging Face in and out, against real transformers (4.44, on Debian's torch 1.13).

Run with the venv of scripts/hf-venv.sh:  .venv-hf/bin/python tests/ref/hf_roundtrip.py BIN_DIR
(BIN_DIR holds autosp-train). Exits 77 (skipped) when transformers is not importable.

For a tiny GPT-2 and a Llama with GQA and llama3 rope_scaling, saved by save_pretrained sharded
in bf16 (and, at P = 1 only except Qwen2 at P = 2 too, the other families 4.44 has: Qwen2 with its
q/k/v biases and a tied head, Mistral with a head_dim apart from hidden / heads, and a Llama with
attention_bias, mlp_bias and yarn rope scaling):
  1. autosp-train with "model": {"from": DIR} in float64 at P = 1 and P = 2 (sequence parallel)
     has HF's loss on the same tokens at step 1 (within 1e-6);
  2. its checkpoint step_N loads in AutoModelForCausalLM.from_pretrained with no missing,
     unexpected or mismatched keys, and HF's loss with those weights equals ours at step N + 1;
  3. model.from and --init-from take step_N back (the same loss again).

The helpers (tiny_models, write_tokens, batch_tokens, hf_loss, run_autosp) are for other round-trip
checks too (greedy generate against autosp's sampler).
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_common import launch, skip, write_tokens  # noqa: E402,F401  (write_tokens: for the scripts importing it from here)

try:
    import transformers
    from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)
except ImportError as e:  # the venv is missing: skipped, not failed
    skip(e)

VOCAB, SEQ, BATCH = 96, 16, 2
TOL = 1e-6
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}


def tiny_models():
    """name -> an HF model with random weights. Llama: head dim 8 and rope_theta 100, so the llama3
    scaling has a kept (high-frequency), a smoothed and two divided frequencies."""
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                         rope_theta=100.0, rope_scaling=LLAMA3_SCALING, rms_norm_eps=1e-5,
                                         tie_word_embeddings=False))
    family = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
    qwen2 = Qwen2ForCausalLM(Qwen2Config(**family, rope_theta=1000.0, tie_word_embeddings=True))
    mistral = MistralForCausalLM(MistralConfig(**family, rope_theta=500.0, head_dim=16, sliding_window=None,
                                               tie_word_embeddings=False))
    # yarn as 4.44 computes it: its correction range uses max_position_embeddings (transformers 5
    # uses original_max_position_embeddings, which defaults to it), so the key is left out.
    llama_bias = LlamaForCausalLM(LlamaConfig(**family, rope_theta=100.0, attention_bias=True, mlp_bias=True,
                                              rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 8.0},
                                              tie_word_embeddings=False))
    for m in (gpt2, llama, qwen2, mistral, llama_bias):  # HF's init is std 0.02: larger weights make the losses differ more
        with torch.no_grad():
            for name, p in m.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.2)
                elif m not in (gpt2, llama):  # the new families' biases (HF inits them 0) and norms
                    p.normal_(0.0, 0.2) if name.endswith(".bias") else p.normal_(1.0, 0.1)
    return {"gpt2": gpt2, "llama": llama, "qwen2": qwen2, "mistral": mistral, "llama-bias-yarn": llama_bias}


# Sequence-parallel degrees per model (each P = 1 run also checks from_pretrained of its checkpoint;
# the step_N-back checks run for the first two, whose paths do not depend on the family).
PARALLEL = {"gpt2": (1, 2), "llama": (1, 2), "qwen2": (1, 2), "mistral": (1,), "llama-bias-yarn": (1,)}


def save_sharded_bf16(model, path, shard="20KB"):
    model.to(torch.bfloat16).save_pretrained(path, max_shard_size=shard, safe_serialization=True)
    model.to(torch.float32)
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json")), f"{path}: not sharded"


def batch_tokens(tokens, step, batch=BATCH, seq=SEQ, dp=1, rank=0):
    """[batch, seq + 1] tokens of 0-based step `step` (DESIGN.md: the llm.c data order)."""
    rows = []
    for b in range(batch):
        start = ((step * dp + rank) * batch + b) * seq
        rows.append([tokens[(start + i) % len(tokens)] for i in range(seq + 1)])
    return torch.tensor(rows, dtype=torch.int64)


def hf_loss(model, x):
    """Token-mean next-token loss of `model` on x [B, S + 1], in the model's dtype. The head is applied
    here: LlamaForCausalLM.forward casts its logits to float32 (`logits.float()`), which would cut
    a float64 model's loss to float32 precision."""
    with torch.no_grad():
        hidden = model.base_model(input_ids=x[:, :-1])[0]
        logits = model.get_output_embeddings()(hidden)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).item()


def load_hf(path):
    transformers.utils.logging.disable_progress_bar()
    model, info = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info[kind]:
            raise AssertionError(f"{path}: from_pretrained reports {kind} {info[kind]}")
    return model.eval()


def run_autosp(bin_dir, work, config, np_=1, extra=(), name="run"):
    """Runs autosp-train on `config`; returns the list of per-step metrics."""
    cfg_path = os.path.join(work, f"{name}.json")
    metrics = os.path.join(work, f"{name}.metrics.jsonl")
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    cmd = [os.path.join(bin_dir, "autosp-train"), "--config", cfg_path, "--metrics", metrics, "--quiet", *extra]
    if os.path.exists(metrics):
        os.remove(metrics)
    launch(cmd, np_)
    with open(metrics) as f:
        return [json.loads(line) for line in f if line.strip()]


def check(what, ours, theirs, tol=TOL):
    diff = abs(ours - theirs)
    print(f"{what}: autosp {ours:.12f} transformers {theirs:.12f} |diff| {diff:.2e}")
    if not diff <= tol:
        raise AssertionError(f"{what}: autosp's loss {ours} differs from transformers' {theirs} by {diff} > {tol}")


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    work = tempfile.mkdtemp(prefix="autosp-hf-")
    try:
        tokens = write_tokens(os.path.join(work, "tokens.bin"), 4096, VOCAB)
        for name, model in tiny_models().items():
            src = os.path.join(work, f"{name}-hf")
            save_sharded_bf16(model, src)
            ref = load_hf(src)  # the bf16 weights, widened to float64 as autosp reads them
            want = hf_loss(ref, batch_tokens(tokens, 0))
            steps, ckpt_step = 3, 2
            for P in PARALLEL[name]:
                ckpt = os.path.join(work, f"{name}-ckpt-p{P}")
                config = {
                    "model": {"from": src},
                    "data": {"source": "tokens", "path": os.path.join(work, "tokens.bin"), "seq_len": SEQ,
                             "batch_size": BATCH},
                    "train": {"steps": steps, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 0, "log_every": 1,
                              "checkpoint_dir": ckpt, "checkpoint_every": ckpt_step, "keep_checkpoints": 0,
                              "max_shard_mb": 0.02},  # 20 kB: the checkpoint is sharded too
                    "runtime": {"dtype": "float64"},
                    "sequence_parallel": {"autosp_size": P},
                }
                m = run_autosp(bin_dir, work, config, np_=P, name=f"{name}-p{P}")
                check(f"{name} P={P} step 1 (model.from, sharded bf16)", m[0]["loss"], want)
                if name in ("llama", "llama-bias-yarn") and P == 1:  # the check can fail: without rope_scaling the loss moves
                    plain = dict(config, model={"from": src, "rope_scaling": None}, train=dict(config["train"], steps=1,
                                                                                              checkpoint_dir=""))
                    off = run_autosp(bin_dir, work, plain, name="llama-unscaled")[0]["loss"]
                    print(f"llama without rope_scaling: {off:.12f}")
                    assert abs(off - want) > 1e3 * TOL, "the loss does not depend on rope_scaling"
                step_dir = os.path.join(ckpt, f"step_{ckpt_step:08d}")
                for f in ("config.json", "model.safetensors.index.json", "optimizer.safetensors", "meta.json"):
                    assert os.path.exists(os.path.join(step_dir, f)), f"{step_dir}: no {f}"
                back = load_hf(step_dir)
                check(f"{name} P={P} from_pretrained(step_{ckpt_step}) at step {ckpt_step + 1}", m[ckpt_step]["loss"],
                      hf_loss(back, batch_tokens(tokens, ckpt_step)))
                if P == 1 and name in ("gpt2", "llama"):  # step_N back in: model.from, --init-from of the same model
                    again = dict(config, model={"from": step_dir}, train=dict(config["train"], steps=1,
                                                                                 checkpoint_dir=""))
                    want_back = hf_loss(back, batch_tokens(tokens, 0))
                    back_m = run_autosp(bin_dir, work, again, name=f"{name}-back")
                    check(f"{name} model.from step_{ckpt_step}", back_m[0]["loss"], want_back)
                    m2 = run_autosp(bin_dir, work, dict(again, model={"from": src}), extra=["--init-from", step_dir],
                                    name=f"{name}-init")
                    check(f"{name} --init-from step_{ckpt_step}", m2[0]["loss"], want_back)
        print("hf round trip: ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
