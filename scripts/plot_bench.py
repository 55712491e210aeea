#!/usr/bin/python3
"""PNG plots of an autosp-bench sweep (Debian's python3-matplotlib; run with /usr/bin/python3).

  /usr/bin/python3 scripts/plot_bench.py ROWS.csv|ROWS.jsonl [--out-dir DIR] [--prefix NAME] [--title TEXT]

ROWS is what `autosp-bench --sweep-seq ... --sweep-ranks ... --out ROWS` wrote. For each model in it,
writes into DIR (default: the current directory):
  {prefix}{model}-throughput.png   tokens/s (global batch) against sequence length, one line per P
  {prefix}{model}-memory.png       per-rank peak memory (allocator high-water, max over ranks)
                                   against sequence length, one line per P
  {prefix}{model}-vs-pytorch.png   only when the sweep ran with --compare-pytorch: P = 1 peak memory,
                                   autosp against PyTorch eager, both as the resident-set high-water
                                   mark over the pre-step baseline (the like-for-like measure)
Rows with an "error" (a point that failed, e.g. out of memory) are left out and listed on stderr.
Prints the paths it wrote.
"""
import argparse
import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def number(v):
    if v is None or v == "":
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def read_rows(path):
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".jsonl"):
                rows = [json.loads(line) for line in f if line.strip()]
            elif path.endswith(".csv"):
                rows = list(csv.DictReader(f))
            else:
                fail(f"{path}: expected a .csv or .jsonl file from autosp-bench --out")
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    good = []
    for r in rows:
        if not isinstance(r, dict) or number(r.get("P")) is None or number(r.get("seq")) is None:
            fail(f"{path}: a row without P and seq: {r!r}")
        if r.get("error"):
            print(f"plot_bench: skipping failed point P={r.get('P')} seq={r.get('seq')}: {r['error']}", file=sys.stderr)
            continue
        good.append(r)
    if not good:
        fail(f"{path}: no successful rows")
    return good


def by_p(rows, column):
    """{P: [(seq, value)]} sorted by seq, for rows where `column` is a number."""
    lines = {}
    for r in rows:
        v = number(r.get(column))
        if v is not None:
            lines.setdefault(int(number(r["P"])), []).append((int(number(r["seq"])), v))
    return {p: sorted(pts) for p, pts in sorted(lines.items())}


def seq_axis(ax, rows):
    seqs = sorted({int(number(r["seq"])) for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs)
    ax.set_xticklabels([f"{s // 1024}k" if s % 1024 == 0 else str(s) for s in seqs])
    ax.set_xlabel("sequence length (tokens)")
    ax.grid(True, which="major", alpha=0.3)


def plot(rows, column, scale, ylabel, title, path, extra=None):
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for p, pts in by_p(rows, column).items():
        ax.plot([s for s, _ in pts], [v / scale for _, v in pts], marker="o", label=f"P = {p}")
    if extra:
        for label, pts, style in extra:
            if pts:
                ax.plot([s for s, _ in pts], [v / scale for _, v in pts], style, marker="s", label=label)
    seq_axis(ax, rows)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plot an autosp-bench sweep")
    ap.add_argument("rows")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--prefix", default="")
    ap.add_argument("--title", default="", help="appended to every plot's title (e.g. the machine)")
    args = ap.parse_args(argv)
    rows = read_rows(args.rows)
    os.makedirs(args.out_dir, exist_ok=True)
    suffix = f" ({args.title})" if args.title else ""
    for model in sorted({r.get("model", "model") for r in rows}):
        mr = [r for r in rows if r.get("model", "model") == model]
        stem = os.path.join(args.out_dir, f"{args.prefix}{model}")
        plot(mr, "tokens_per_sec", 1.0, "tokens / s (whole step, all ranks)",
             f"{model}: training-step throughput{suffix}", stem + "-throughput.png")
        plot(mr, "peak_bytes", 2 ** 20, "peak memory per rank (MiB)",
             f"{model}: per-rank peak memory (allocator high-water){suffix}", stem + "-memory.png")
        pt = [r for r in mr if number(r.get("pytorch_peak_bytes")) is not None and int(number(r["P"])) == 1]
        if pt:
            fig_rows = [r for r in mr if int(number(r["P"])) == 1]
            ours = sorted((int(number(r["seq"])), number(r["peak_rss_bytes"])) for r in pt)
            theirs = sorted((int(number(r["seq"])), number(r["pytorch_peak_bytes"])) for r in pt)
            fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
            ax.plot([s for s, _ in ours], [v / 2 ** 30 for _, v in ours], marker="o", label="autosp (P = 1)")
            ax.plot([s for s, _ in theirs], [v / 2 ** 30 for _, v in theirs], "--", marker="s", label="PyTorch eager")
            seq_axis(ax, fig_rows)
            ax.set_yscale("log")
            ax.set_ylabel("peak RSS over the pre-step baseline (GiB)")
            ax.set_title(f"{model}: step memory, autosp vs PyTorch eager{suffix}", fontsize=10)
            ax.legend()
            fig.tight_layout()
            fig.savefig(stem + "-vs-pytorch.png")
            plt.close(fig)
            print(stem + "-vs-pytorch.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
