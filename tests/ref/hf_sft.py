#!/usr/bin/env python3
"""Fine-tuning with loss masks against transformers (4.44): a tiny Llama with a ChatML chat template
(tests/ref/chat_fixture.py), conversations through scripts/prepare_data.py --chat, then autosp-train
with "model": {"from": DIR}, data.loss_mask_path and runtime.dtype float64 for one step at P = 1, 2
and 4 (--thread-ranks; at P = 2 also with 3 micro-batches of gradient accumulation). Its step-1 loss
equals transformers' on the same windows with Hugging Face's labels (the window's tokens, -100
where the mask is 0: the model shifts them), in float64 (within 1e-9), its target count is the
number of unmasked targets, and its first-step gradients (--dump-grads) equal autograd's through
the transformers model (within 1e-6 of each gradient's largest entry: the
loss agrees to 1e-11, the gradients to about 1.5e-7, where 4.44 keeps a float32 step). LlamaForCausalLM(input_ids, labels=...).loss itself
is checked to agree too (in float32, where 4.44 computes its logits).

  .venv-hf/bin/python tests/ref/hf_sft.py BIN_DIR     (exit 77: transformers is not importable)
"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

try:
    import transformers
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"skipped: transformers is not importable ({e}); run scripts/hf-venv.sh", file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
S = 64


def stream(d):
    ids, mask = [], []
    for p in sorted(glob.glob(os.path.join(d, "train_*.bin"))):
        raw = open(p, "rb").read()
        n = struct.unpack("<3i", raw[:12])[2]
        ids += list(struct.unpack(f"<{n}H", raw[1024:]))
        mask += [int(v) for v in np.load(p[:-4] + ".npy")]
    return ids, mask


def run(bin_dir, work, config, name, ranks=1):
    cfg_path, metrics = os.path.join(work, name + ".json"), os.path.join(work, name + ".jsonl")
    grads = os.path.join(work, name + ".grads.safetensors")
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    cmd = [os.path.join(bin_dir, "autosp-train"), "--config", cfg_path, "--metrics", metrics, "--quiet",
           "--dump-grads", grads]
    if ranks > 1:
        cmd += ["--thread-ranks", str(ranks)]
    p = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    from safetensors.torch import load_file
    with open(metrics) as f:
        return json.loads(f.readline()), load_file(grads)


def main():
    bin_dir = sys.argv[1]
    transformers.utils.logging.set_verbosity_error()
    py = sys.executable
    with tempfile.TemporaryDirectory() as work:
        model_dir, conv, data = (os.path.join(work, n) for n in ("model", "conv.jsonl", "data"))
        subprocess.run([py, os.path.join(HERE, "chat_fixture.py"), model_dir, "--model", "--conversations", conv, "12"],
                       check=True)
        subprocess.run([py, os.path.join(ROOT, "scripts", "prepare_data.py"), "--out", data, "--tokenizer", model_dir,
                        "--chat", "--seq-len", str(S), "--val-fraction", "0", conv], check=True, capture_output=True)
        info = json.load(open(os.path.join(data, "data.json")))
        ids, mask = stream(data)
        n_win = (len(ids) - 1) // S
        assert n_win == 12 and len(ids) == n_win * S + 1, (len(ids), n_win)
        x = torch.tensor([ids[w * S:w * S + S + 1] for w in range(n_win)])
        m = torch.tensor([mask[w * S:w * S + S + 1] for w in range(n_win)])
        labels = torch.where(m != 0, x, torch.full_like(x, -100))  # HF's labels: unshifted, -100 where masked
        targets = int((labels[:, 1:] != -100).sum())

        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64).eval()
        # float64 throughout: the head applied here (4.44's forward casts the logits to float32).
        hidden = model.base_model(input_ids=x[:, :-1])[0]
        logits = model.get_output_embeddings()(hidden)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100)
        names = [n for n, _ in model.named_parameters()]
        want_grads = dict(zip(names, torch.autograd.grad(loss, [p for _, p in model.named_parameters()])))
        want = loss.item()
        with torch.no_grad():
            hf = model(input_ids=x, labels=labels).loss.item()
        print(f"transformers: loss {want:.12f} (forward with labels= in float32: {hf:.9f}), {targets} targets")
        assert abs(hf - want) < 1e-6, "model(input_ids, labels=...).loss agrees at float32"

        base = {"model": {"from": model_dir},
                "data": {"source": "tokens", "path": info["data"]["path"], "loss_mask_path": info["data"]["loss_mask_path"],
                         "seq_len": S, "batch_size": n_win},
                "train": {"steps": 1, "log_every": 1}, "runtime": {"dtype": "float64", "threads": 1}}
        failures = []
        for P, k in ((1, 1), (2, 1), (4, 1), (2, 3)):
            cfg = json.loads(json.dumps(base))
            cfg["sequence_parallel"] = {"autosp_size": P}
            cfg["data"]["batch_size"] = n_win // k
            cfg["train"]["gradient_accumulation_steps"] = k
            rec, grads = run(bin_dir, work, cfg, f"p{P}k{k}", ranks=P)
            worst = max(float(((grads[n].double() - g).abs().max() / g.abs().max().clamp_min(1e-30)))
                        for n, g in want_grads.items())
            line = (f"P = {P}, {k} micro-batch(es): loss {rec['loss']:.12f} |diff| {abs(rec['loss'] - want):.2e}, "
                    f"targets {rec['targets']}, worst gradient rel. error {worst:.2e}")
            print(line)
            if not (abs(rec["loss"] - want) < 1e-9 and rec["targets"] == targets and worst < 1e-6
                    and set(grads) == set(want_grads)):
                failures.append(line)
        if failures:
            print("FAILED:\n  " + "\n  ".join(failures))
            return 1
    print("masked loss and gradients equal transformers at P = 1, 2, 4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
