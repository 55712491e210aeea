#!/usr/bin/python3
"""PNG plots of autosp runs and evaluations (Debian's python3-matplotlib; run with /usr/bin/python3).

  /usr/bin/python3 scripts/plot_metrics.py FILE... [--out-dir DIR] [--labels A,B,...] [--prefix NAME]
                                           [--title TEXT]

Each FILE is one of:
  RUN.jsonl   autosp-train --metrics (one JSON object per logged step): one line per run in
              {prefix}loss.png (training loss, and the validation loss as markers on a dashed line),
              {prefix}lr.png, {prefix}grad-norm.png and {prefix}throughput.png (tokens/s);
  EVAL.json   autosp-eval --perplexity-by-position: one line per file in
              {prefix}perplexity-by-position.png (each bucket's mean loss at its middle position);
  PASS.json   autosp-eval --passkey: one heatmap per file, {prefix}passkey[-LABEL].png (accuracy
              per context length × depth).
Several files of a kind are drawn on the same plot, labelled by --labels (in file order) or their
file names, so runs compare at a glance (before / after a context extension). Writes into DIR
(default: the current directory) and prints the paths it wrote. Input that is not one of these is
an `error:` line and exit 2.
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def number(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def read(path):
    """('run', rows) | ('ppl', object) | ('passkey', object)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        fail(f"{path}: {e.strerror or e}")
    try:
        if path.endswith(".jsonl"):
            rows = []
            lines = text.splitlines()
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    # A run killed mid-write leaves its last line cut short: plot the rows before it.
                    if n == len(lines) and not text.endswith("\n") and rows:
                        print(f"warning: {path}: line {n} is cut short (a run stopped while writing it): "
                              f"plotting the {len(rows)} rows before it", file=sys.stderr)
                        break
                    fail(f"{path}: line {n}: not JSON: {e}")
            if not rows or not all(isinstance(r, dict) and number(r.get("step")) is not None for r in rows):
                fail(f"{path}: expected autosp-train --metrics lines (JSON objects with a step)")
            return "run", rows
        obj = json.loads(text)
    except ValueError as e:
        fail(f"{path}: not JSON: {e}")
    task = obj.get("task") if isinstance(obj, dict) else None
    if task == "perplexity_by_position":
        if not isinstance(obj.get("buckets"), list) or not all(
                isinstance(b, dict) and number(b.get("start")) is not None and number(b.get("end")) is not None
                for b in obj["buckets"]):
            fail(f"{path}: perplexity_by_position without buckets of start and end")
        return "ppl", obj
    if task == "passkey":
        if not isinstance(obj.get("cells"), list) or not all(
                isinstance(c, dict) and all(number(c.get(k)) is not None for k in ("length", "depth", "accuracy"))
                for c in obj["cells"]):
            fail(f"{path}: passkey without cells of length, depth and accuracy")
        return "passkey", obj
    fail(f"{path}: expected autosp-train --metrics (.jsonl) or autosp-eval JSON (task perplexity_by_position "
         "or passkey)")


def series(rows, key):
    pts = [(r["step"], number(r.get(key))) for r in rows]
    return [p[0] for p in pts if p[1] is not None], [p[1] for p in pts if p[1] is not None]


def save(fig, out_dir, name, written):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)


def plot_runs(runs, args, written):
    for name, ylabel, keys, log in (("loss", "loss (nats)", ("loss", "val_loss"), False),
                                    ("lr", "learning rate", ("lr",), False),
                                    ("grad-norm", "gradient norm (before clipping)", ("grad_norm",), True),
                                    ("throughput", "tokens/s", ("tokens_per_sec",), False)):
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = 0
        for i, (label, rows) in enumerate(runs):
            color = f"C{i % 10}"
            x, y = series(rows, keys[0])
            if x:
                ax.plot(x, y, color=color, label=f"{label}" + (" (train)" if len(keys) > 1 else ""))
                drawn += 1
            if len(keys) > 1:
                x, y = series(rows, keys[1])
                if x:
                    ax.plot(x, y, color=color, linestyle="--", marker="o", label=f"{label} (validation)")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if log and drawn:
            ax.set_yscale("log")
        ax.set_title(f"{args.title}: {ylabel}" if args.title else ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        save(fig, args.out_dir, f"{args.prefix}{name}.png", written)


def plot_ppl(evals, args, written):
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, obj in evals:
        pts = [((b["start"] + b["end"]) / 2, number(b.get("loss"))) for b in obj["buckets"]]
        pts = [p for p in pts if p[1] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"{label} (S = {obj.get('seq_len')})")
    ax.set_xlabel("position in the sequence (bucket middle)")
    ax.set_ylabel("mean loss of the bucket's targets (nats)")
    ax.set_title(f"{args.title}: loss by position" if args.title else "loss by position")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, args.out_dir, f"{args.prefix}perplexity-by-position.png", written)


def plot_passkey(label, obj, args, written, single):
    lengths = sorted({int(c["length"]) for c in obj["cells"]})
    depths = sorted({float(c["depth"]) for c in obj["cells"]})
    grid = [[math.nan] * len(lengths) for _ in depths]
    for c in obj["cells"]:
        grid[depths.index(float(c["depth"]))][lengths.index(int(c["length"]))] = float(c["accuracy"])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.2 + 0.45 * len(depths)))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                ax.text(j, i, f"{v:.0%}", ha="center", va="center", fontsize=7)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("depth of the key")
    ax.set_title(f"passkey retrieval: {label}")
    fig.colorbar(im, ax=ax, label="accuracy")
    save(fig, args.out_dir, f"{args.prefix}passkey{'' if single else '-' + label}.png", written)


def main():
    p = argparse.ArgumentParser(description="PNG plots of autosp-train --metrics and autosp-eval JSON")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--out-dir", default=".")
    p.add_argument("--labels", help="comma-separated names for the files, in order (default: file names)")
    p.add_argument("--prefix", default="")
    p.add_argument("--title", default="")
    args = p.parse_args()
    labels = args.labels.split(",") if args.labels else [os.path.splitext(os.path.basename(f))[0] for f in args.files]
    if len(labels) != len(args.files):
        fail(f"--labels: {len(labels)} names for {len(args.files)} files")
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        fail(f"--out-dir {args.out_dir}: {e.strerror or e}")
    kinds = {"run": [], "ppl": [], "passkey": []}
    for label, path in zip(labels, args.files):
        kind, data = read(path)
        kinds[kind].append((label, data))
    written = []
    if kinds["run"]:
        plot_runs(kinds["run"], args, written)
    if kinds["ppl"]:
        plot_ppl(kinds["ppl"], args, written)
    for label, obj in kinds["passkey"]:
        plot_passkey(label, obj, args, written, len(kinds["passkey"]) == 1)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
