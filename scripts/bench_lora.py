#!/usr/bin/env python3
"""A LoRA training step on the CPU: autosp against PyTorch eager + PEFT, alternated A B A B.

  PY scripts/bench_lora.py [--config configs/llama-tiny.json] [--seq 1024] [--batch 2] [--r 16]
      [--targets all-linear] [--threads 2] [--steps 6] [--rounds 3] [--bin build/bin]

PY is a Python with torch, transformers 4.44 and PEFT 0.12 (a current PyTorch 2.x for a fair
baseline). Both sides train the same model (the config's "model", saved once by transformers'
save_pretrained in float32, which autosp reads with model.from) with the same adapter
(r, lora_alpha = 2r, the targets, dropout 0, PEFT's default init) on the same tokens (one random
llm.c shard; batch `--batch` of `--seq` tokens), float32, with gradient clipping at 1.0 and AdamW
on the adapters only. A round runs autosp-train for `--steps` steps (its step_ms from --metrics) and
then PEFT's steps in this process (forward with labels, backward, clip_grad_norm_, AdamW.step);
the first step of each side in a round is a warm-up and is left out. Prints one JSON line per side
per round and a last line with the medians and their ratio (PEFT's step time / autosp's), and the
fastest steps and their ratio (on a shared machine, each side's least disturbed step).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

try:
    import transformers
    from peft import LoraConfig, get_peft_model
except ImportError as e:
    print(f"error: {e}: run with a Python that has transformers and peft", file=sys.stderr)
    sys.exit(2)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hf_model(cfg):
    m = cfg["model"]
    conf = transformers.LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
                                    intermediate_size=m["intermediate_size"], num_hidden_layers=m["num_hidden_layers"],
                                    num_attention_heads=m["num_attention_heads"],
                                    num_key_value_heads=m.get("num_key_value_heads", m["num_attention_heads"]),
                                    max_position_embeddings=m.get("max_position_embeddings", 4096),
                                    rope_theta=m.get("rope_theta", 10000.0), rms_norm_eps=m.get("norm_eps", 1e-6),
                                    tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(conf)


def write_tokens(path, n, vocab):
    tokens = np.random.default_rng(1).integers(0, vocab, size=n, dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    return torch.from_numpy(tokens.astype(np.int64))


def autosp_round(a, work, base_dir, tokens_path):
    metrics = os.path.join(work, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [os.path.join(a.bin, "autosp-train"), "--config", a.config, "--quiet", "--metrics", metrics,
           "--steps", str(a.steps), "--set", f"model.from={base_dir}", "--set", "data.source=tokens",
           "--set", f"data.path={tokens_path}", "--set", f"data.seq_len={a.seq}", "--set", f"data.batch_size={a.batch}",
           "--set", f"runtime.threads={a.threads}", "--set", "train.log_every=1", "--set", "train.grad_clip=1.0",
           "--set", f"lora.r={a.r}", "--set", f"lora.lora_alpha={2 * a.r}", "--set", f"lora.target_modules={a.targets}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
    with open(metrics) as f:
        steps = [json.loads(line)["step_ms"] for line in f if line.strip()]
    return steps[1:]


def peft_round(a, model, opt, x):
    times = []
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss  # HF shifts the labels itself
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times[1:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "llama-tiny.json"))
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--targets", default="all-linear")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with open(a.config) as f:
        cfg = json.load(f)
    work = tempfile.mkdtemp(prefix="autosp-bench-lora-")
    base_dir = os.path.join(work, "base")
    model = hf_model(cfg)
    model.save_pretrained(base_dir, safe_serialization=True)
    n = a.batch * a.seq + 1
    tokens = write_tokens(os.path.join(work, "tokens.bin"), n + 16, cfg["model"]["vocab_size"])
    x = torch.stack([tokens[b * a.seq: b * a.seq + a.seq + 1] for b in range(a.batch)])  # autosp's first batch
    targets = a.targets if a.targets == "all-linear" else a.targets.split(",")
    peft_model = get_peft_model(model, LoraConfig(r=a.r, lora_alpha=2 * a.r, lora_dropout=0.0, target_modules=targets))
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours, theirs = [], []
    for k in range(a.rounds):
        s = autosp_round(a, work, base_dir, os.path.join(work, "tokens.bin"))
        ours += s
        print(json.dumps({"round": k, "impl": "autosp", "step_ms": s}), flush=True)
        t = peft_round(a, peft_model, opt, x)
        theirs += t
        print(json.dumps({"round": k, "impl": "pytorch+peft", "step_ms": t}), flush=True)
    mo, mt = statistics.median(ours), statistics.median(theirs)
    print(json.dumps({"autosp_step_ms": mo, "peft_step_ms": mt, "ratio": mt / mo, "autosp_min_ms": min(ours),
                      "peft_min_ms": min(theirs), "ratio_min": min(theirs) / min(ours), "seq": a.seq, "batch": a.batch,
                      "r": a.r, "targets": a.targets, "threads": a.threads, "torch": torch.__version__,
                      "transformers": transformers.__version__, "trainable": sum(p.numel() for p in trainable),
                      "loadavg_1m": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
