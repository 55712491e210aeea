#!/usr/bin/env python3
"""CPU training step of a tiny Mixtral: autosp against PyTorch eager transformers, or against a dense
model of the same active parameters, alternated.

  PYTHONPATH=DEPS PYTHON scripts/bench_moe.py BIN_DIR [--rounds R] [--steps N] [--threads T] [--against dense]

PYTHON is a current PyTorch 2.x with transformers importable (DEPS: a pip --target folder of
transformers 4.44.2 when the venv lacks it). One tiny Mixtral (4 layers, hidden 256, 8 heads, 4
key/value heads, 8 experts of width 512, top 2, vocab 512), random weights (seed 0) saved with
save_pretrained in float32, trained on the same llm.c token shard by both sides: autosp-train with
"model": {"from": DIR} (float32, data.batch_size 2, data.seq_len 512), and MixtralForCausalLM in
train mode (its default attention, sdpa) with torch.optim.AdamW, gradients clipped to 1.0 like
autosp's default. Each round runs N steps of one side, then of the other (A B A B ...); a side's
time is the median step time of its rounds' steps after the first two. Prints one JSON line per
round and the ratio, of the medians and of the fastest steps (on a loaded machine the fastest step
is the one least disturbed), with the one-minute load average before and after (`load`). A benchmark, not a test: nothing here asserts a speed.

--against dense: both sides are autosp-train on the same tokens and config, the Mixtral against a
dense Mistral with the same attention, embeddings and head whose MLP is as wide as the k experts a
token reaches (intermediate top_k × 512 = 1024): the same parameters per token but the router's
256 × 8. The ratio is then the dense model's step time over the Mixtral's (tokens/s MoE / dense).

--cpu-time: each side's CPU seconds (user + system) per step instead of wall time, for a machine
other work loads (there wall time measures the scheduler). Use it with --threads 1: one thread's
CPU time is its compute, while a parallel region's spin-waits would count. autosp's per step is
(the CPU time of a run of N steps − that of a run of 2) / (N − 2), startup cancelling out;
PyTorch's is time.process_time() around each step.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from transformers import MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM

VOCAB, SEQ, BATCH = 512, 512, 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--against", choices=("pytorch", "dense"), default="pytorch")
    ap.add_argument("--cpu-time", action="store_true")
    a = ap.parse_args()
    if a.cpu_time and a.steps <= 4:
        ap.error("--cpu-time needs --steps > 4")
    clock = time.process_time if a.cpu_time else time.perf_counter
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
                        max_position_embeddings=SEQ, sliding_window=None, tie_word_embeddings=False)
    model = MixtralForCausalLM(cfg)
    work = tempfile.mkdtemp(prefix="autosp-bench-moe-")
    src = os.path.join(work, "mixtral")
    model.save_pretrained(src, safe_serialization=True)
    n = BATCH * (SEQ + 1) * (a.steps + 1) * a.rounds + 1
    tokens = np.random.default_rng(1).integers(0, VOCAB, size=n, dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, n
    shard = os.path.join(work, "tokens.bin")
    with open(shard, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    config = {"model": {"from": src},
              "data": {"source": "tokens", "path": shard, "seq_len": SEQ, "batch_size": BATCH},
              "train": {"steps": a.steps, "lr": 1e-4, "warmup_steps": 0, "log_every": 1},
              "runtime": {"dtype": "float32", "threads": a.threads}}
    cfg_path = write_config(work, "run.json", config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    t = torch.from_numpy(tokens.astype(np.int64))

    def run_train(path, steps):
        metrics = os.path.join(work, "m.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([os.path.join(a.bin_dir, "autosp-train"), "--config", path, "--metrics", metrics, "--quiet",
                        "--set", f"train.steps={steps}"],
                       check=True, env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(metrics) as f:
            ms = [json.loads(line)["step_ms"] for line in f if line.strip()]
        return ms, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e3

    def train(path):
        """Step times in ms (wall; with --cpu-time the CPU ms per step, repeated so the median sees it)."""
        ms, cpu = run_train(path, a.steps)
        if not a.cpu_time:
            return ms
        _, cpu2 = run_train(path, 2)
        return [0.0, 0.0] + [(cpu - cpu2) / (a.steps - 2)] * (a.steps - 2)

    def ours():
        return train(cfg_path)

    def theirs():
        out = []
        for s in range(a.steps):
            x = t[s * BATCH * SEQ:(s + 1) * BATCH * SEQ + 1]
            ids, labels = x[:-1].view(BATCH, SEQ), x[1:].view(BATCH, SEQ)
            start = clock()
            opt.zero_grad(set_to_none=True)
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            out.append((clock() - start) * 1e3)
        return out

    if a.against == "dense":
        return against_dense(a, cfg, config, work, train, ours)
    load_before = os.getloadavg()[0]
    times = {"autosp": [], "pytorch": []}
    for r in range(a.rounds):
        for name, run in (("autosp", ours), ("pytorch", theirs)):
            ms = run()[2:]
            times[name] += ms
            print(json.dumps({"round": r, "impl": name, "step_ms": [round(v, 1) for v in ms]}))
    med = {k: statistics.median(v) for k, v in times.items()}
    tok = BATCH * SEQ
    low = {k: min(v) for k, v in times.items()}
    print(json.dumps({"torch": torch.__version__, "autosp_step_ms": round(med["autosp"], 1),
                      "pytorch_step_ms": round(med["pytorch"], 1),
                      "min_step_ms": {k: round(v, 1) for k, v in low.items()},
                      "speedup_of_min": round(low["pytorch"] / low["autosp"], 2),
                      "autosp_tok_s": round(tok / med["autosp"] * 1e3), "pytorch_tok_s": round(tok / med["pytorch"] * 1e3),
                      "speedup": round(med["pytorch"] / med["autosp"], 2),
                      "load": [round(load_before, 2), round(os.getloadavg()[0], 2)]}))


def write_config(work, name, config):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def against_dense(a, cfg, config, work, train, ours):
    """The Mixtral (`ours`) against the dense Mistral of its active parameters, both autosp-train."""
    dense = MistralConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                          intermediate_size=cfg.num_experts_per_tok * cfg.intermediate_size,
                          num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                          num_key_value_heads=cfg.num_key_value_heads, max_position_embeddings=SEQ,
                          sliding_window=None, tie_word_embeddings=False)
    src = os.path.join(work, "mistral")
    MistralForCausalLM(dense).save_pretrained(src, safe_serialization=True)
    dense_path = write_config(work, "dense.json", dict(config, model={"from": src}))
    times = {"moe": [], "dense": []}
    for r in range(a.rounds):
        for name, run in (("moe", ours), ("dense", lambda: train(dense_path))):
            ms = run()[2:]
            times[name] += ms
            print(json.dumps({"round": r, "model": name, "step_ms": [round(v, 1) for v in ms]}))
    med = {k: statistics.median(v) for k, v in times.items()}
    tok = BATCH * SEQ
    low = {k: min(v) for k, v in times.items()}
    print(json.dumps({"moe_step_ms": round(med["moe"], 1), "dense_step_ms": round(med["dense"], 1),
                      "min_step_ms": {k: round(v, 1) for k, v in low.items()},
                      "moe_over_dense_of_min": round(low["dense"] / low["moe"], 2),
                      "moe_tok_s": round(tok / med["moe"] * 1e3), "dense_tok_s": round(tok / med["dense"] * 1e3),
                      "moe_over_dense_tok_s": round(med["dense"] / med["moe"], 2)}))


if __name__ == "__main__":
    sys.exit(main())
