"""PyTorch's side of `autosp-bench --mode attention`: torch.nn.functional.scaled_dot_product_attention
forward and backward on CPU, served to the C++ driver so that the two alternate in one run.

  .venv-bench/bin/python scripts/bench_attention.py --threads T      (started by autosp-bench)

Reads one JSON request per line on stdin and answers one JSON line on stdout:
  {"B", "N", "Nkv", "S", "D", "causal", "warmup", "iters", "dir"?}
    -> {"fwd_ms", "bwd_ms" (medians over iters), "gqa", "torch", "max_err"?}
  dir (optional): a folder with q, k, v, dout (the C++ side's inputs) and o, dq, dk, dv (its outputs)
    as raw little-endian float32 in [B, N|Nkv, S, D] layout; PyTorch then runs on those tensors and
    max_err holds max |ours - PyTorch| of o, dq, dk, dv, each over max |PyTorch| of that tensor.
EOF or {"quit": true} ends it. float32, contiguous [B, N, S, D] tensors, scale 1/sqrt(D).
With "window": W, query i sees keys i - W < j <= i (Hugging Face's sliding_window): fwd_ms, bwd_ms
time scaled_dot_product_attention with that boolean mask ([S, S], broadcast; its CPU flash kernel
takes it but visits every block), and flex_fwd_ms the forward of flex_attention (torch.compile'd, as
its docs ask; the first call compiles) with the sliding-window block mask, which skips the blocks
outside the window; flex_attention has no CPU backward. GQA: K and V repeated for the masked SDPA,
enable_gqa for flex.

GQA (N > Nkv): torch >= 2.5 takes enable_gqa=True; whether its CPU flash kernel or the math fallback
runs depends on the version, so the first GQA request times both that and the repeat_interleave of
K and V into a plain SDPA call (what Hugging Face's sdpa attention does), and keeps whichever is
faster for the rest of the run ("gqa" says which). The expand and the reduction of dK, dV over the
group are then inside the timed region, as they are in a model.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def load(dirname, name, shape):
    return torch.from_numpy(np.fromfile(f"{dirname}/{name}", dtype="<f4").reshape(shape))


def make_call(mode, group, causal):
    if mode == "enable_gqa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    if mode == "repeat_kv":
        return lambda q, k, v: F.scaled_dot_product_attention(
            q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), is_causal=causal)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def window_calls(S, W, group):
    """(masked SDPA, compiled flex_attention forward) for a sliding window of W keys."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    i = torch.arange(S)
    visible = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - W)

    def sdpa(q, k, v):
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)

    mask = create_block_mask(lambda b, h, qi, ki: (ki <= qi) & (ki > qi - W), B=None, H=None, Q_LEN=S, KV_LEN=S,
                             device="cpu")
    flex = torch.compile(flex_attention)
    return sdpa, lambda q, k, v: flex(q, k, v, block_mask=mask, enable_gqa=group > 1)


def time_forward(call, q, k, v, warmup, iters):
    ms = []
    with torch.no_grad():
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            call(q, k, v)
            if i >= warmup:
                ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def time_call(call, q, k, v, dout, warmup, iters):
    fwd, bwd = [], []
    for i in range(warmup + iters):
        for t in (q, k, v):
            t.grad = None
        t0 = time.perf_counter()
        o = call(q, k, v)
        t1 = time.perf_counter()
        o.backward(dout)
        t2 = time.perf_counter()
        if i >= warmup:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
    return statistics.median(fwd), statistics.median(bwd), o


def rel_err(ours, ref):
    scale = float(ref.abs().max())
    return float((ours - ref).abs().max()) / (scale if scale > 0 else 1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gqa_mode = None  # chosen on the first GQA request
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            break
        B, N, Nkv, S, D = (int(req[x]) for x in ("B", "N", "Nkv", "S", "D"))
        causal, warmup, iters = bool(req["causal"]), int(req["warmup"]), int(req["iters"])
        group = N // Nkv
        if req.get("dir"):
            d = req["dir"]
            q, k, v = load(d, "q", (B, N, S, D)), load(d, "k", (B, Nkv, S, D)), load(d, "v", (B, Nkv, S, D))
            dout = load(d, "dout", (B, N, S, D))
        else:
            g = torch.Generator().manual_seed(0)
            q, dout = (torch.randn(B, N, S, D, generator=g) for _ in range(2))
            k, v = (torch.randn(B, Nkv, S, D, generator=g) for _ in range(2))
        for t in (q, k, v):
            t.requires_grad_(True)
        out = {"torch": torch.__version__, "threads": torch.get_num_threads()}
        if req.get("window"):
            sdpa, flex = window_calls(S, int(req["window"]), group)
            fwd, bwd, _ = time_call(sdpa, q, k, v, dout, warmup, iters)
            out.update({"fwd_ms": fwd, "bwd_ms": bwd, "flex_fwd_ms": time_forward(flex, q.detach(), k.detach(), v.detach(), max(warmup, 1), iters),
                        "gqa": "repeat_kv" if group > 1 else "plain"})
            print(json.dumps(out), flush=True)
            continue
        if group == 1:
            mode = "plain"
        elif gqa_mode is None:
            best = None
            for cand in ("enable_gqa", "repeat_kv"):
                try:
                    f, b, _ = time_call(make_call(cand, group, causal), q, k, v, dout, 1, 1)
                except (TypeError, RuntimeError):
                    continue  # enable_gqa is not in this torch
                if best is None or f + b < best[0]:
                    best = (f + b, cand)
            gqa_mode = mode = best[1]
        else:
            mode = gqa_mode
        fwd, bwd, o = time_call(make_call(mode, group, causal), q, k, v, dout, warmup, iters)
        out.update({"fwd_ms": fwd, "bwd_ms": bwd, "gqa": mode})
        if req.get("dir"):
            with torch.no_grad():
                out["max_err"] = {
                    "o": rel_err(load(d, "o", (B, N, S, D)), o),
                    "dq": rel_err(load(d, "dq", (B, N, S, D)), q.grad),
                    "dk": rel_err(load(d, "dk", (B, Nkv, S, D)), k.grad),
                    "dv": rel_err(load(d, "dv", (B, Nkv, S, D)), v.grad),
                }
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
