#!/usr/bin/python3
"""Longest sequence that trains within a memory budget, found by running training steps.

  scripts/longest_trainable.py --impl autosp|pytorch --config configs/llama-tiny.json --budget-gib 4
      [--checkpoint | --no-checkpoint] [--threads T] [--bin build/bin] [--python PY]
      [--multiple 1024] [--fit 8192,16384] [--margin 0.03] [--data random|config]
      [--grow 1.25] [--[no-]drop-caches] [--from S] [--probe S1,S2,...] [--set k=v ...] [--out probes.jsonl]
      [--pairs]

Each probe is one process that runs one training step (forward, backward, gradient clipping, AdamW)
of the config's model at batch 1 and sequence length S:
  autosp   {bin}/autosp-train --config CFG --steps 1 --set data.seq_len=S --set data.batch_size=1
           --set runtime.activation_checkpointing=... --set data.source=tokens --set data.path=F, where F
           is an llm.c token shard of random tokens the script writes (--data config: the config's
           own data instead; the synthetic task keeps its logits to score accuracy, costing
           B·S·V·4 bytes more; --pairs adds a loss mask and pair ids beside it and trains
           train.objective "dpo" on one pair a window, each sequence S/2 tokens, half of it completion)
  pytorch  PY scripts/bench_pytorch.py --config CFG --batch 1 --seq S --warmup 0 --iters 1 --[no-]checkpoint
           (PY: a current PyTorch, scripts/pytorch-venv.sh prints it)

Where this machine lets us create a memory cgroup (v2 memory.max, or v1 memory.limit_in_bytes;
swap off), each probe runs inside one limited to the budget, as a container with that much memory
would run it (method "cgroup"), and it fits when it exits 0: a step that needs more is killed or
fails to allocate. Everything the process touches is charged, the page cache of the libraries it
maps included (reclaimable, like a container's); so that libraries cached by an earlier process are
charged too, the page cache is dropped before each probe where /proc/sys/vm/drop_caches is writable
("caches_dropped"; --no-drop-caches leaves it, as the tests do). Without a cgroup (method "rss") a probe fits when it exits 0 with a peak
resident set (the kernel's ru_maxrss: the whole process, its mapped libraries included) within the
budget, a stricter test for a process that maps large libraries (PyTorch's CUDA build: ~0.5 GB that
a cgroup could reclaim).

Search: two probes at the --fit lengths give the growth in bytes per token; the budget over that
line predicts the longest S; from there probes go up by --grow (25 %) while they fit, then bisect between
the longest that fitted and the shortest that did not until the two are within --margin (all
rounded to --multiple). --from S resumes an earlier search: S is taken as fitting and the first
probe is one --margin above it. --probe S1,S2,... runs one probe at each length and no search: it
shows that lengths fit (say, a multiple of the other side's longest) where finding the longest
would take hours of quadratic attention; the last line then lists the ones that fit. The long probes take time: each
is a full step, quadratic in S through attention.

Prints one JSON line per probe (S, fits, exit status, peak bytes, seconds, the tail of stderr when
it failed) and a last line {"longest_fits", "shortest_fails", "bytes_per_token", ...}. A failure
that is not a lack of memory (a bad config, a crash) stops the search: exit 1. Bad flags: exit 2.
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MEMORY_WORDS = ("out of memory", "can't allocate", "cannot allocate", "bad_alloc", "memoryerror",
                 "failed to allocate")


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


class Cgroup:
    """A memory cgroup limited to `limit` bytes with swap off, or None where none can be made."""

    @staticmethod
    def make(limit):
        name = f"autosp-longest-{os.getpid()}"
        v2 = "/sys/fs/cgroup"
        if os.path.exists(os.path.join(v2, "cgroup.controllers")):
            path = os.path.join(v2, name)
            files = {"limit": "memory.max", "peak": "memory.peak", "swap": "memory.swap.max"}
        else:
            path = os.path.join(v2, "memory", name)
            files = {"limit": "memory.limit_in_bytes", "peak": "memory.max_usage_in_bytes",
                     "swap": "memory.memsw.limit_in_bytes"}
        try:
            os.mkdir(path)
        except OSError:
            return None
        cg = Cgroup(path, files)
        try:
            cg.write("limit", str(limit))
            if os.path.exists(os.path.join(path, files["swap"])):
                cg.write("swap", "0" if files["swap"] == "memory.swap.max" else str(limit))
        except OSError:
            cg.remove()
            return None
        return cg

    def __init__(self, path, files):
        self.path, self.files = path, files

    def write(self, key, value):
        with open(os.path.join(self.path, self.files[key]), "w", encoding="ascii") as f:
            f.write(value)

    def peak(self):
        try:
            with open(os.path.join(self.path, self.files["peak"]), encoding="ascii") as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def reset_peak(self):
        try:  # v1: writing resets max_usage; v2's memory.peak resets per cgroup on newer kernels only
            self.write("peak", "0")
        except OSError:
            pass

    def enter(self, pid):
        with open(os.path.join(self.path, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(pid))

    def remove(self):
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def token_shard(a, S):
    """An llm.c token shard of S + 1 random tokens below the config's vocabulary, in the run's
    scratch folder: uint16 (header: 256 int32, magic 20240520, version 1, count), or uint32 (magic
    20240801, version 7) for a vocabulary past 65,536 tokens."""
    path = os.path.join(a.scratch, f"tokens-{S}.bin")
    if not os.path.exists(path):
        with open(a.config, encoding="utf-8") as f:
            vocab = int(json.load(f)["model"]["vocab_size"])
        rng = random.Random(S)
        n = S + 1
        wide = vocab > 65536
        header = struct.pack("<256i", 20240801 if wide else 20240520, 7 if wide else 1, n, *([0] * 253))
        tokens = struct.pack(f"<{n}{'I' if wide else 'H'}", *(rng.randrange(vocab) for _ in range(n)))
        with open(path, "wb") as f:
            f.write(header + tokens)
    return path


def npy(path, descr, values, fmt):
    """A one-dimensional .npy file (format 1.0) of `values`."""
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, len(values))
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()
                + struct.pack(f"<{len(values)}{fmt}", *values))


def pair_files(a, S):
    """--pairs: the loss mask and pair ids (scripts/prepare_data.py --preference's files) beside
    token_shard(a, S): one pair, chosen = tokens [0, S/2), rejected = [S/2, S), each's second half its
    completion; token S (no target of the window) a pad."""
    half = S // 2
    masks, pairs = os.path.join(a.scratch, f"tokens-{S}.npy"), os.path.join(a.scratch, f"pairs-{S}.npy")
    if not os.path.exists(pairs):
        ids = [1] * half + [-1] * (S - half) + [0]
        mask = [1 if (t % half) >= half // 2 else 0 for t in range(S)] + [0]
        npy(masks, "|u1", mask, "B")
        npy(pairs, "<i4", ids, "i")
    return ["--set", f"data.loss_mask_path={masks}", "--set", f"data.pairs_path={pairs}",
            "--set", "train.objective=dpo"]


def drop_page_cache():
    """Drop the clean page cache (root only), so that the next probe's libraries are read, and
    charged, inside its cgroup. Returns whether it was dropped."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as f:
            f.write("1")
        return True
    except OSError:
        return False


def probe_command(a, S):
    cfg = os.path.abspath(a.config)
    ck = a.checkpoint
    if a.impl == "autosp":
        data = [] if a.data == "config" else ["--set", "data.source=tokens", "--set", f"data.path={token_shard(a, S)}"]
        data += pair_files(a, S) if a.pairs else []
        cmd = [os.path.join(a.bin, "autosp-train"), "--config", cfg, "--steps", "1",
               "--set", f"data.seq_len={S}", "--set", "data.batch_size=1",
               "--set", f"model.max_position_embeddings={max(S, 1)}",
               "--set", f"runtime.activation_checkpointing={'true' if ck else 'false'}",
               "--set", f"runtime.threads={a.threads}"] + data
        for kv in a.set:
            cmd += ["--set", kv]
        return cmd
    return [a.python, os.path.join(_ROOT, "scripts", "bench_pytorch.py"), "--config", cfg, "--batch", "1",
            "--seq", str(S), "--warmup", "0", "--iters", "1", "--mode", "step", "--threads", str(a.threads),
            "--checkpoint" if ck else "--no-checkpoint"]


def run_probe(a, S, cgroup, budget):
    cmd = probe_command(a, S)
    dropped = False
    if cgroup:
        dropped = a.drop_caches and drop_page_cache()
        cgroup.reset_peak()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=_ROOT,
                            preexec_fn=(lambda: cgroup.enter(os.getpid())) if cgroup else None)
    err = proc.stderr.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = code = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    secs = time.monotonic() - t0
    rss = usage.ru_maxrss * 1024
    cg_peak = cgroup.peak() if cgroup else None
    killed = code < 0 and -code == signal.SIGKILL
    fits = code == 0 and (cgroup is not None or rss <= budget)
    tail = [line[:300] for line in err.strip().splitlines()[-3:]]
    memory_failure = killed or any(w in err.lower() for w in _MEMORY_WORDS) or (code == 0 and not fits)
    rec = {"impl": a.impl, "S": S, "fits": fits, "exit": code, "peak_rss_bytes": rss,
           "cgroup_peak_bytes": cg_peak, "caches_dropped": dropped, "seconds": round(secs, 1),
           "checkpoint": a.checkpoint}
    if not fits:
        rec["stderr_tail"] = tail
    print(json.dumps(rec), flush=True)
    if a.out:
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
    if not fits and not memory_failure:
        print(f"error: S={S}: the step failed for a reason other than memory (exit {code}): "
              + " | ".join(tail), file=sys.stderr)
        sys.exit(1)
    return rec


def round_to(S, m):
    return max(m, S // m * m)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", choices=["autosp", "pytorch"], required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--budget-gib", type=float, required=True)
    ap.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", default=os.path.join(_ROOT, "build", "bin"))
    ap.add_argument("--python", default=os.path.join(_ROOT, ".venv-bench", "bin", "python"))
    ap.add_argument("--multiple", type=int, default=1024)
    ap.add_argument("--fit", default="8192,16384", help="two sequence lengths for the bytes-per-token line")
    ap.add_argument("--margin", type=float, default=0.03)
    ap.add_argument("--grow", type=float, default=1.25, help="factor between probes while they fit")
    ap.add_argument("--from", dest="known", type=int,
                    help="a length an earlier run of this budget found to fit: the search starts one --margin "
                         "above it instead of at the prediction")
    ap.add_argument("--data", choices=["random", "config"], default="random")
    ap.add_argument("--pairs", action="store_true",
                    help="autosp with --data random: train.objective dpo on one preference pair a window")
    ap.add_argument("--drop-caches", action=argparse.BooleanOptionalAction, default=True,
                    help="drop the page cache before each probe in a cgroup (root only)")
    ap.add_argument("--probe", help="only probe these lengths (comma-separated), no search")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out")
    a = ap.parse_args()
    if not (a.budget_gib > 0) or a.threads < 1 or a.multiple < 1 or not (0 < a.margin < 1) or not (a.grow > 1):
        fail("--budget-gib must be > 0, --threads and --multiple >= 1, --margin in (0, 1), --grow > 1")
    try:
        fit = [int(x) for x in a.fit.split(",")]
    except ValueError:
        fit = []
    if a.known is not None and a.known < 1:
        fail(f"--from {a.known}: expected a positive length")
    if a.pairs and (a.impl != "autosp" or a.data != "random"):
        fail("--pairs: DPO probes are autosp-train's on the script's own data (--impl autosp --data random)")
    probes = None
    if a.probe is not None:
        try:
            probes = [int(x) for x in a.probe.split(",")]
        except ValueError:
            probes = []
        if not probes or min(probes) < 1:
            fail(f"--probe '{a.probe}': expected positive lengths, e.g. 26624,53248")
    if len(fit) != 2 or fit[0] < 1 or fit[1] <= fit[0]:
        fail(f"--fit '{a.fit}': expected two increasing positive lengths, e.g. 8192,16384")
    if not os.path.isfile(a.config):
        fail(f"--config {a.config}: no such file")
    exe = os.path.join(a.bin, "autosp-train") if a.impl == "autosp" else a.python
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        fail(f"{exe}: not found (build autosp, or create the PyTorch venv with scripts/pytorch-venv.sh)")
    budget = int(a.budget_gib * 2**30)

    a.scratch = tempfile.mkdtemp(prefix="autosp-longest-")
    cgroup = Cgroup.make(budget)
    method = "cgroup" if cgroup else "rss"
    try:
        if probes:
            fits = [S for S in probes if run_probe(a, S, cgroup, budget)["fits"]]
            print(json.dumps({"impl": a.impl, "budget_bytes": budget, "method": method, "checkpoint": a.checkpoint,
                              "probed": probes, "fit": fits}), flush=True)
            return 0
        r0, r1 = (run_probe(a, S, cgroup, budget) for S in fit)
        if not (r0["fits"] and r1["fits"]):
            print("error: the --fit lengths do not fit the budget; give shorter ones", file=sys.stderr)
            return 1
        per_token = (r1["peak_rss_bytes"] - r0["peak_rss_bytes"]) / (fit[1] - fit[0])
        fixed = r0["peak_rss_bytes"] - per_token * fit[0]
        if per_token <= 0:
            print("error: the peak did not grow between the --fit lengths; give longer ones", file=sys.stderr)
            return 1
        predicted = round_to(int((budget - fixed) / per_token), a.multiple)
        # From the prediction: up by 25 % while it fits, then bisect the bracket [longest that
        # fitted, shortest that did not] until it is within --margin (a memory curve need not be
        # a line: PyTorch's is not).
        lo, hi = fit[1], None
        S = max(predicted, fit[1] + a.multiple)
        if a.known:
            lo = max(lo, a.known)
            S = round_to(int(lo * (1 + a.margin)), a.multiple)
        while True:
            if run_probe(a, S, cgroup, budget)["fits"]:
                lo = S
            else:
                hi = S
            if hi is not None and hi - lo <= max(a.multiple, int(lo * a.margin)):
                break
            S = round_to(int(lo * a.grow), a.multiple) if hi is None else round_to((lo + hi) // 2, a.multiple)
            if S <= lo:
                S = lo + a.multiple
            if hi is not None and S >= hi:
                break
        print(json.dumps({"impl": a.impl, "budget_bytes": budget, "method": method, "checkpoint": a.checkpoint,
                          "longest_fits": lo, "shortest_fails": hi, "bytes_per_token": round(per_token),
                          "fixed_bytes": round(fixed), "predicted": predicted}), flush=True)
    finally:
        if cgroup:
            cgroup.remove()
        shutil.rmtree(a.scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
