#!/usr/bin/python3
"""autosp-plan's cost model and memory plan against measured runs on this machine.

  scripts/validate_plan.py [--bin build/bin] [--config configs/llama-tiny.json] [--ranks 4] [--seq 2048]
      [--steps 6] [--rounds 1] [--set k=v ...] [--mpirun-arg A ...] [--out rows.jsonl]

For each layout of a fixed list (Ulysses, ring, Ulysses x ring, data parallel, checkpointing, ZeRO-3,
the tiled MLP and loss), `autosp-plan --only-config` gives the planned peak per rank and the
estimated step time, and `mpirun --oversubscribe -np RANKS autosp-train` runs it (random llm.c
tokens, so the synthetic task's scored logits do not count) for --steps steps: the median step_ms
of the steps after the first, and the peak_bytes of rank 0. With --rounds N the layouts run N times
in turn (A B C ... A B C ...). Prints a markdown table and the Spearman rank correlation between
predicted and measured step times; one JSON line per run to --out.
"""
import argparse
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile

LAYOUTS = [  # name, --set lines
    ("Ulysses 4", ["sequence_parallel.autosp_size=4"]),
    ("ring 4", ["sequence_parallel.autosp_size=4", "sequence_parallel.ring_size=4"]),
    ("Ulysses 2 x ring 2", ["sequence_parallel.autosp_size=4", "sequence_parallel.ring_size=2"]),
    ("sp 2, dp 2", ["sequence_parallel.autosp_size=2"]),
    ("dp 4", ["sequence_parallel.autosp_size=1"]),
    ("Ulysses 4, checkpointing", ["sequence_parallel.autosp_size=4", "runtime.activation_checkpointing=true"]),
    ("Ulysses 4, ZeRO 3", ["sequence_parallel.autosp_size=4", "zero_optimization.stage=3"]),
    ("sp 2, dp 2, checkpointing, tiled MLP and loss",
     ["sequence_parallel.autosp_size=2", "runtime.activation_checkpointing=true", "runtime.tiled_mlp=true",
      "runtime.tiled_loss=true"]),
]


def spearman(xs, ys):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):  # ties share their mean rank
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--config", default="configs/llama-tiny.json")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--mpirun-arg", action="append", default=[], help="passed to mpirun (e.g. --mca mpi_yield_when_idle 1)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.ranks < 1 or a.seq < 1 or a.steps < 2 or a.rounds < 1:
        print("error: --ranks, --seq, --rounds must be >= 1 and --steps >= 2", file=sys.stderr)
        sys.exit(2)
    tmp = tempfile.mkdtemp()
    tokens = os.path.join(tmp, "tokens.bin")
    random.seed(1)
    n = max(100000, 4 * a.seq * a.steps * a.ranks + 1)
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, n
    with open(tokens, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack("<%dH" % n, *[random.randrange(256) for _ in range(n)]))
    base = a.set + ["data.source=tokens", "data.path=" + tokens, "data.seq_len=%d" % a.seq]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = open(a.out, "a") if a.out else None
    rows = {name: {"measured_ms": [], "peak": []} for name, _ in LAYOUTS}
    for name, sets in LAYOUTS:
        args = sum((["--set", s] for s in base + sets), [])
        plan = subprocess.run([os.path.join(a.bin, "autosp-plan"), "--config", a.config, *args, "--seq-len", str(a.seq),
                               "--ranks", str(a.ranks), "--device", "cpu", "--only-config", "--format", "json"],
                              capture_output=True, text=True)
        if plan.returncode not in (0, 1):
            print("error: autosp-plan failed for %s: %s" % (name, plan.stderr.strip()), file=sys.stderr)
            sys.exit(1)
        j = json.loads(plan.stdout)
        c = (j["best"] or [j.get("closest")])[0]
        rows[name].update(predicted_s=c["step_s"], planned=c["peak_bytes"])
    for _ in range(a.rounds):
        for name, sets in LAYOUTS:
            args = sum((["--set", s] for s in base + sets), [])
            metrics = os.path.join(tmp, "m.jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            run = subprocess.run(["mpirun", "--oversubscribe", *a.mpirun_arg, "-np", str(a.ranks),
                                  os.path.join(a.bin, "autosp-train"),
                                  "--config", a.config, *args, "--steps", str(a.steps), "--set", "train.log_every=1",
                                  "--set", "train.eval_every=0", "--metrics", metrics, "--quiet"],
                                 capture_output=True, text=True, env=env)
            if run.returncode != 0:
                print("error: autosp-train failed for %s: %s" % (name, run.stderr.strip()[-400:]), file=sys.stderr)
                sys.exit(1)
            steps = [json.loads(l) for l in open(metrics)]
            ms = statistics.median(s["step_ms"] for s in steps[1:])
            peak = max(s["peak_bytes"] for s in steps)
            rows[name]["measured_ms"].append(ms)
            rows[name]["peak"].append(peak)
            if out:
                out.write(json.dumps({"layout": name, "step_ms": ms, "peak_bytes": peak, **{k: v for k, v in rows[name].items()
                                                                                          if k in ("predicted_s", "planned")}}) + "\n")
    names = [n for n, _ in LAYOUTS]
    pred = [rows[n]["predicted_s"] for n in names]
    meas = [statistics.median(rows[n]["measured_ms"]) for n in names]
    print("| layout | predicted step ms | measured step ms (median of rounds) | planned peak | measured peak | planned / measured |")
    print("|---|---|---|---|---|---|")
    for n, p, m in zip(names, pred, meas):
        pk = max(rows[n]["peak"])
        print("| %s | %.1f | %.1f | %d | %d | %.3f |" % (n, p * 1e3, m, rows[n]["planned"], pk, rows[n]["planned"] / pk))
    print("\nSpearman(predicted, measured) = %.3f over %d layouts" % (spearman(pred, meas), len(names)))


if __name__ == "__main__":
    main()
