#!/usr/bin/python3
"""Gradient accumulation's cost and memory (issue 26 goals), alternated A B A B in one run.

  scripts/bench_accumulation.py [--bin build/bin] [--config configs/llama-tiny.json] [--seq 1024]
                                [--ranks 2] [--k 4] [--rounds 3] [--memory-seq 8192]

Time: autosp-train on --ranks MPI ranks (sp = ranks) with micro-batch 1, once with k = 1 for 4·k
steps and once with k micro-batches for 4 steps, alternated --rounds times; each run's median
step_ms (the first step dropped) from --metrics. Prints k·micro-step cost = median(k) / (k ·
median(1)) per round and the median over rounds.
Memory: one process at S = --memory-seq, k = 1 and k, 2 steps each: the peak RSS (GNU time's %M)
and the planned arena peak (peak_bytes), beside the gradient accumulator's size (the f32
parameters' bytes).
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def run(bin_dir, config, ranks, seq, k, steps, sets=()):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as d:
        metrics = os.path.join(d, "m.jsonl")
        cmd = [f"{bin_dir}/autosp-train", "--config", config, "--quiet", "--metrics", metrics,
               "--set", f"data.seq_len={seq}", "--set", "data.batch_size=1", "--set", f"train.steps={steps}",
               "--set", "train.log_every=1", "--set", f"train.gradient_accumulation_steps={k}",
               "--set", f"sequence_parallel.autosp_size={ranks}", "--set", "runtime.threads=1"]
        for s in sets:
            cmd += ["--set", s]
        if ranks > 1:
            cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
        else:
            cmd = ["/usr/bin/time", "-f", "maxrss_kb %M", "-o", os.path.join(d, "rss")] + cmd
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = [json.loads(l) for l in open(metrics)]
        rss = None
        if ranks == 1:
            rss = int(open(os.path.join(d, "rss")).read().split()[-1]) * 1024
        return rows, rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--config", default="configs/llama-tiny.json")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory-seq", type=int, default=8192)
    a = ap.parse_args()
    ratios = []
    for r in range(a.rounds):
        one, _ = run(a.bin, a.config, a.ranks, a.seq, 1, 4 * a.k + 1)
        acc, _ = run(a.bin, a.config, a.ranks, a.seq, a.k, 5)
        t1 = statistics.median(x["step_ms"] for x in one[1:])
        tk = statistics.median(x["step_ms"] for x in acc[1:])
        sync1 = statistics.median(x["grad_sync_ms"] for x in one[1:])
        synck = statistics.median(x["grad_sync_ms"] for x in acc[1:])
        ratios.append(tk / (a.k * t1))
        print(json.dumps({"round": r, "k1_step_ms": t1, f"k{a.k}_step_ms": tk, "ratio": tk / (a.k * t1),
                          "k1_sync_ms": sync1, f"k{a.k}_sync_ms": synck}))
    print(json.dumps({"median_ratio": statistics.median(ratios), "seq": a.seq, "ranks": a.ranks, "k": a.k}))
    for k in (1, a.k):
        rows, rss = run(a.bin, a.config, 1, a.memory_seq, k, 2)
        print(json.dumps({"memory_seq": a.memory_seq, "k": k, "peak_rss_bytes": rss,
                          "arena_peak_bytes": max(x["peak_bytes"] for x in rows)}))


if __name__ == "__main__":
    main()
