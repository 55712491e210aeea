#!/usr/bin/python3
"""Longest sequence that fits a per-rank memory budget, from autosp's memory plan.

  scripts/longest_sequence.py --config configs/llama-tiny.json --budget-gib 24 --ranks 1,4 [--set k=v ...]

For each P it binary-searches S (a multiple of P) so that `autosp-graph --stage joint
--plan-memory S=...` (the arena of intermediates plus parameters, gradients, AdamW moments and
inputs of one rank) fits the budget. Prints one JSON line per P.
"""
import argparse
import json
import subprocess
import sys


def planned(bin_dir, config, p, s, sets):
    cmd = [f"{bin_dir}/autosp-graph", "--config", config, "--world", str(p), "--rank", "0", "--stage", "joint",
           "--set", f"sequence_parallel.autosp_size={p}", "--plan-memory", f"S={s}"]
    for kv in sets:
        cmd += ["--set", kv]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["total_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--budget-gib", type=float, required=True)
    ap.add_argument("--ranks", default="1,4")
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    budget = int(a.budget_gib * 2**30)
    for p in (int(x) for x in a.ranks.split(",")):
        lo, hi = p, p
        while planned(a.bin, a.config, p, hi, a.set) <= budget:
            lo, hi = hi, hi * 2
        while hi - lo > p:  # invariant: lo fits, hi does not
            mid = (lo + hi) // 2 // p * p
            if mid <= lo:
                break
            if planned(a.bin, a.config, p, mid, a.set) <= budget:
                lo = mid
            else:
                hi = mid
        print(json.dumps({"ranks": p, "budget_bytes": budget, "longest_seq": lo,
                          "planned_bytes": planned(a.bin, a.config, p, lo, a.set)}))


if __name__ == "__main__":
    sys.exit(main())
