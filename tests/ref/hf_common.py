"""What the scripts that check autosp against transformers share: the token shard, the gradient
comparison, the skip without the venv of
scripts/hf-venv.sh (exit 77, a ctest skip) and the launch of an autosp binary, under mpirun for
more than one rank, with one OpenMP thread per process and mpirun allowed to run as root.
"""
import os
import subprocess
import sys

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def skip(error, what="transformers"):
    """Exit 77 (skipped, not failed): `what` did not import (`error`)."""
    print(f"skipped: {what} is not importable ({error}); run scripts/hf-venv.sh", file=sys.stderr)
    sys.exit(77)


def write_tokens(path, n, vocab, seed=1):
    """An llm.c token shard (magic 20240520, version 1, uint16 tokens); returns the tokens."""
    import numpy as np
    tokens = np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    return tokens.astype(np.int64)


def compare_grads(what, ours, theirs, rel):
    """Every gradient of `ours` within rel x the largest of `theirs` (dicts of tensors by name)."""
    import torch
    assert set(ours) == set(theirs), f"{what}: names differ: {sorted(set(ours) ^ set(theirs))}"
    scale = max(t.abs().max().item() for t in theirs.values())
    diffs = {n: (ours[n].to(torch.float64) - theirs[n]).abs().max().item() for n in theirs}
    worst = max(diffs.values())
    for n in sorted(diffs, key=diffs.get)[-3:] if worst > rel * scale else []:
        print(f"  {n}: {diffs[n]:.2e}")
    print(f"{what}: {len(theirs)} gradients, largest difference {worst:.2e} of largest {scale:.2e}")
    assert worst <= rel * scale, f"{what}: gradients differ by {worst} > {rel} x {scale}"



def train_config(work, src, seq, batch, steps=1, **more):
    """An autosp-train config of one float64 run of the HF directory `src` on work/tokens.bin (lr 1e-3,
    no warmup, a line a step), each keyword's dict merged into that section."""
    c = {"model": {"from": src},
         "data": {"source": "tokens", "path": os.path.join(work, "tokens.bin"), "seq_len": seq, "batch_size": batch},
         "train": {"steps": steps, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 0, "log_every": 1},
         "runtime": {"dtype": "float64"}}
    for k, v in more.items():
        c[k] = dict(c.get(k, {}), **v)
    return c

def launch(cmd, ranks=1, timeout=300):
    """Runs cmd (a list) on `ranks` processes; returns its stdout, or raises naming the command."""
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), *cmd]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout
