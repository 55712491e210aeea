#!/usr/bin/env python3
"""LoRA against PEFT on transformers (PEFT 0.12 and transformers 4.44 on Debian's torch 1.13, in
float64), for GPT-2, Llama, Qwen2 and Mistral (transformers 4.44 has no Qwen3: tests/ref/hf_lora.py
leaves it to the float64 reference of tests/ref/torch_models.py, which autosp's Qwen3 is checked
against without LoRA, and to the rewrite's family-free math, checked for every family here).

Run with the venv of scripts/hf-venv.sh:  .venv-hf/bin/python tests/ref/hf_lora.py BIN_DIR
Exits 77 (skipped) when transformers or peft is not importable.

For each family: a tiny model saved by save_pretrained, an adapter made by get_peft_model (every
projection, random A and B: init_lora_weights False, so every adapter gradient is nonzero;
modules_to_save on a norm; rsLoRA on one family) and saved by PEFT, then
  1. autosp-train with model.from and lora.from (the PEFT adapter) has PEFT's loss on the same
     tokens at step 1 and, by --dump-grads, PEFT's gradients of every adapter and saved tensor;
     within 1e-12 for GPT-2, and for the RoPE families within hf_roundtrip's 1e-6 (loss) and 1e-5
     of the largest gradient, since transformers 4.44 computes their RoPE cos and sin in float32;
  2. its checkpoint after step 2 is an adapter directory that PeftModel.from_pretrained(base, dir)
     loads (no missing or unexpected keys) to autosp's loss at step 3;
  3. autosp-train --merge-lora writes a model directory that from_pretrained loads (no PEFT) to
     PEFT's loss with the adapter;
  4. for Llama: P = 2 (Ulysses) has the same loss as P = 1.
"""
import json
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_common import launch, skip  # noqa: E402

try:
    import peft
    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
except ImportError as e:
    skip(e, "transformers or peft")

from hf_roundtrip import VOCAB, batch_tokens, check, load_hf, run_autosp, tiny_models, write_tokens  # noqa: E402

SEQ, BATCH = 16, 2
# family -> (target_modules, modules_to_save, use_rslora)
CASES = {
    "gpt2": (["c_attn", "c_proj", "c_fc"], ["ln_f"], False),
    "llama": ("all-linear", ["norm"], False),
    "qwen2": (["q_proj", "k_proj", "v_proj", "o_proj"], ["model.norm"], True),
    "mistral": (["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"], None, False),
}


def loss_of(model, x):
    """Token-mean next-token loss in the model's dtype (the head applied here, as hf_roundtrip's hf_loss)."""
    inner = model.base_model.model if isinstance(model, PeftModel) else model
    hidden = inner.base_model(input_ids=x[:, :-1])[0]
    logits = inner.get_output_embeddings()(hidden)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def peft_adapter(base_dir, out_dir, targets, saved, rslora):
    """A PEFT LoRA adapter with random A and B on the float64 base, saved by PEFT; returns the model."""
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float64)
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, modules_to_save=saved,
                     use_rslora=rslora, init_lora_weights=False, fan_in_fan_out=base.config.model_type == "gpt2")
    torch.manual_seed(1)
    model = get_peft_model(base, cfg)
    with torch.no_grad():  # the saved modules away from their base values, so their copy is what is read
        for name, p in model.named_parameters():
            if "modules_to_save" in name:
                p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(out_dir)
    return model


def peft_grads(model, x):
    """PEFT's loss and its gradients under the adapter checkpoint's names, as --dump-grads writes them
    (PEFT's parameter names less .default: the keys of adapter_model.safetensors)."""
    model.zero_grad()
    loss = loss_of(model, x)
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            key = name.replace(".modules_to_save.default", "").replace(".default", "")
            grads[key] = p.grad.detach().clone()
    return loss.item(), grads


def tolerances(name):
    """(loss, gradient relative to the largest): float64 throughout for GPT-2; transformers' RoPE
    tables are float32 even in a float64 model."""
    return (1e-12, 1e-12) if name == "gpt2" else (1e-6, 1e-5)


def compare_grads(what, ours, theirs, rel):
    missing = set(theirs) ^ set(ours)
    assert not missing, f"{what}: gradients only one side has: {sorted(missing)}"
    scale = max(g.abs().max().item() for g in theirs.values())
    worst = max((ours[k].to(torch.float64) - theirs[k]).abs().max().item() for k in theirs)
    print(f"{what}: {len(theirs)} gradients, largest |diff| {worst:.2e} of largest |grad| {scale:.2e}")
    assert scale > 0 and worst <= rel * scale, f"{what}: gradients differ by {worst} (largest {scale})"


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
    print(f"peft {peft.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
    transformers.utils.logging.disable_progress_bar()
    work = tempfile.mkdtemp(prefix="autosp-lora-")
    try:
        tokens = write_tokens(os.path.join(work, "tokens.bin"), 4096, VOCAB)
        models = tiny_models()
        for name, (targets, saved, rslora) in CASES.items():
            base_dir, adapter_dir = os.path.join(work, f"{name}-base"), os.path.join(work, f"{name}-adapter")
            models[name].to(torch.float64).save_pretrained(base_dir, safe_serialization=True)
            model = peft_adapter(base_dir, adapter_dir, targets, saved, rslora)
            x0 = batch_tokens(tokens, 0, BATCH, SEQ)
            want, want_grads = peft_grads(model, x0)
            ckpt = os.path.join(work, f"{name}-ckpt")
            config = {
                "model": {"from": base_dir},
                "lora": {"from": adapter_dir},
                "data": {"source": "tokens", "path": os.path.join(work, "tokens.bin"), "seq_len": SEQ,
                         "batch_size": BATCH},
                "train": {"steps": 3, "lr": 1e-2, "warmup_steps": 0, "log_every": 1, "checkpoint_dir": ckpt,
                          "checkpoint_every": 2, "keep_checkpoints": 0},
                "runtime": {"dtype": "float64"},
            }
            grads_path = os.path.join(work, f"{name}-grads.safetensors")
            m = run_autosp(bin_dir, work, config, extra=["--dump-grads", grads_path], name=f"{name}-lora")
            tol, rel = tolerances(name)
            check(f"{name} LoRA step 1 (PEFT's adapter in)", m[0]["loss"], want, tol=tol)
            compare_grads(f"{name} LoRA step 1", load_file(grads_path), want_grads, rel)
            # The step-2 checkpoint is a PEFT adapter directory.
            step_dir = os.path.join(ckpt, "step_00000002")
            for f in ("adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "meta.json"):
                assert os.path.exists(os.path.join(step_dir, f)), f"{step_dir}: no {f}"
            base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float64)
            back = PeftModel.from_pretrained(base, step_dir)
            keys = load_file(os.path.join(step_dir, "adapter_model.safetensors")).keys()
            result = peft.set_peft_model_state_dict(back, load_file(os.path.join(step_dir, "adapter_model.safetensors")))
            assert not [k for k in result.unexpected_keys], f"{step_dir}: unexpected keys {result.unexpected_keys}"
            assert not [k for k in result.missing_keys if "lora_" in k or "modules_to_save" in k], \
                f"{step_dir}: missing {result.missing_keys}"
            with torch.no_grad():
                got = loss_of(back, batch_tokens(tokens, 2, BATCH, SEQ)).item()
            check(f"{name} PeftModel.from_pretrained(step_2) at step 3 ({len(keys)} tensors)", m[2]["loss"], got, tol=tol)
            merged_dir = os.path.join(work, f"{name}-merged")
            merge_cfg = os.path.join(work, f"{name}-lora.json")  # run_autosp wrote it
            launch([os.path.join(bin_dir, "autosp-train"), "--config", merge_cfg, "--merge-lora", merged_dir], timeout=120)
            with torch.no_grad():
                merged = loss_of(load_hf(merged_dir), x0).item()
            check(f"{name} --merge-lora into from_pretrained", merged, want, tol=tol)
            if name == "llama":  # sequence parallel: the same adapter, P = 2
                sp = dict(config, sequence_parallel={"autosp_size": 2}, train=dict(config["train"], checkpoint_dir=""))
                m2 = run_autosp(bin_dir, work, sp, np_=2, name="llama-lora-p2")
                check("llama LoRA P=2 step 1", m2[0]["loss"], m[0]["loss"], tol=1e-12)
                check("llama LoRA P=2 step 3", m2[2]["loss"], m[2]["loss"], tol=1e-12)
        print("hf lora: ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
