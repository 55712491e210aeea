"""PyTorch's side of the GPU kit's attention step (scripts/kit/run.sh): torch SDPA forward and
backward with the flash and the cuDNN backends, on the shapes autosp-bench-attention times
(tests/cuda/bench_attention.cpp): bf16, causal, D = 128, B = 1, N = max(2, 128k / S) heads,
S = 4k ... --max-seq. TFLOP/s in the FlashAttention convention (forward 4·B·N·S²·D / 2 causal,
backward 2.5x forward), timed with CUDA events, median of --iters after one warm-up.

  python torch_attention.py [--max-seq 65536] [--iters 3]      one JSON line per (S, backend)
  python torch_attention.py --merge OURS.log TORCH.log          the table run.sh prints
"""
import argparse
import json
import statistics
import sys


def flops(n, s, d=128, b=1):
    fwd = 4.0 * b * n * s * s * d / 2.0
    return fwd, 2.5 * fwd


def bench(max_seq, iters):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    s = 4096
    while s <= max_seq:
        n, d = max(2, 131072 // s), 128
        q, k, v = (torch.randn(1, n, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn(1, n, s, d, device="cuda", dtype=torch.bfloat16)
        for name, backend in backends.items():
            row = {"S": s, "N": n, "backend": name}
            try:
                fwd_ms, bwd_ms = [], []
                with sdpa_kernel(backend):
                    for i in range(iters + 1):
                        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                        e0.record()
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        e1.record()
                        o.backward(dout)
                        e2.record()
                        torch.cuda.synchronize()
                        if i > 0:  # the first is the warm-up
                            fwd_ms.append(e0.elapsed_time(e1))
                            bwd_ms.append(e1.elapsed_time(e2))
                        q.grad = k.grad = v.grad = None
                f, b = flops(n, s)
                fm, bm = statistics.median(fwd_ms), statistics.median(bwd_ms)
                row.update(fwd_ms=fm, bwd_ms=bm, fwd_tflops=f / (fm * 1e9), bwd_tflops=b / (bm * 1e9),
                           fwdbwd_tflops=(f + b) / ((fm + bm) * 1e9))
            except Exception as e:  # a backend that does not take the shape: say so, go on
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            print(json.dumps(row), flush=True)
        del q, k, v, dout
        torch.cuda.empty_cache()
        s *= 2


def merge(ours_log, torch_log):
    """S | ours | cuDNN via our API | torch flash | torch cuDNN, fwd+bwd TFLOP/s."""
    ours = {}
    for line in open(ours_log, errors="replace"):
        f = line.split()
        if len(f) >= 9 and f[0].isdigit():
            ours[int(f[0])] = (f[6], f[7])  # fwd+bwd TF/s, cuDNN f+b TF/s
    theirs = {}
    for line in open(torch_log, errors="replace"):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        theirs[(r["S"], r["backend"])] = f"{r['fwdbwd_tflops']:.1f}" if "fwdbwd_tflops" in r else "error"
    print(f"{'S':>6} {'ours':>8} {'cuDNN(our API)':>15} {'torch flash':>12} {'torch cuDNN':>12}   fwd+bwd TFLOP/s")
    for s in sorted(set(ours) | {k[0] for k in theirs}):
        o, c = ours.get(s, ("-", "-"))
        print(f"{s:>6} {o:>8} {c:>15} {theirs.get((s, 'flash'), '-'):>12} {theirs.get((s, 'cudnn'), '-'):>12}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-seq", type=int, default=65536)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--merge", nargs=2, metavar=("OURS_LOG", "TORCH_LOG"))
    a = ap.parse_args()
    if a.merge:
        merge(*a.merge)
    else:
        bench(a.max_seq, a.iters)


if __name__ == "__main__":
    sys.exit(main())
