"""Hugging Face's side of the GPU kit's Llama step (scripts/kit/run.sh): one training step of
transformers' LlamaForCausalLM (attn_implementation "sdpa") built from the same autosp config
(configs/llama-1b-32k.json: the model keys are HF's own), on the same synthetic batch shape, with
what autosp's bf16 runs do: f32 master weights and AdamW state, bf16 compute (torch.autocast),
global-norm clipping (train.grad_clip, default 1.0), AdamW with the config's hyperparameters.

Reports tokens/s (B·S per step time, median of --iters after --warmup), MFU against --peak-tflops
with autosp-bench's FLOP count (apps/tools/scaling.cpp step_flops: 6·params·tokens, the tied
embedding not counted twice, plus 12·L·S²·N·D·B/2 causal attention), and peak memory
(torch.cuda.max_memory_allocated). --longest then doubles S from the config's until a step runs
out of memory, and bisects to 4k: the longest S that fits.

  python hf_llama_step.py --config llama-1b-32k.json [--seq S] [--warmup 1] [--iters 2]
                          [--peak-tflops 989] [--longest]
  python hf_llama_step.py --summarize-ours LOG     (our autosp-bench row in a log, the same summary)
Prints one JSON line per measurement and a final "summary: ..." line.
"""
import argparse
import json
import statistics
import sys
import time


def hf_config(model, transformers):
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "max_position_embeddings", "rope_theta", "tie_word_embeddings"]
    kw = {k: model[k] for k in keys if k in model}
    kw["rms_norm_eps"] = model.get("norm_eps", 1e-5)
    kw["attention_bias"] = False
    kw["mlp_bias"] = False
    return transformers.LlamaConfig(**kw)


def step_flops(model, n_params, batch, seq):
    heads, hidden, layers = model["num_attention_heads"], model["hidden_size"], model["num_hidden_layers"]
    head_dim = hidden // heads
    return 6.0 * n_params * batch * seq + 12.0 * layers * seq * seq * heads * head_dim * batch * 0.5


def run_steps(net, opt, model_cfg, train_cfg, batch, seq, warmup, iters):
    import torch

    vocab = model_cfg["vocab_size"]
    ids = torch.randint(0, vocab, (batch, seq + 1), device="cuda")
    inputs, labels = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    times = []
    torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(input_ids=inputs).logits
        # HF's loss on already-shifted labels: cross entropy in f32 over every position.
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), train_cfg.get("grad_clip", 1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        del logits, loss
    return statistics.median(times), torch.cuda.max_memory_allocated()


def summarize_ours(log):
    """The last JSON object with tokens_per_sec in autosp-bench's output (stdout and stderr mixed)."""
    row = None
    for line in open(log, errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "tokens_per_sec" in r:
                row = r
    if row is None:
        print("no result row in", log)
        return 1
    mfu = row.get("mfu")
    print(f"{row['tokens_per_sec']:.0f} tok/s, MFU {mfu:.3f}" if mfu is not None else
          f"{row['tokens_per_sec']:.0f} tok/s, MFU ?", end="")
    print(f", peak {row.get('peak_bytes', 0) / 2**30:.1f} GiB")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summarize-ours", metavar="LOG")
    ap.add_argument("--config")
    ap.add_argument("--seq", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--longest", action="store_true")
    a = ap.parse_args()
    if a.summarize_ours:
        return summarize_ours(a.summarize_ours)
    if not a.config:
        ap.error("--config is required")

    import torch
    import transformers

    cfg = json.load(open(a.config))
    model_cfg, train_cfg = cfg["model"], cfg.get("train", {})
    seq = a.seq or cfg["data"]["seq_len"]
    batch = a.batch or cfg["data"].get("batch_size", 1)
    torch.manual_seed(0)
    hf_cfg = hf_config(model_cfg, transformers)
    try:  # transformers 4.36+: the attention implementation is chosen at construction
        net = transformers.LlamaForCausalLM._from_config(hf_cfg, attn_implementation="sdpa")
    except (AttributeError, TypeError):
        hf_cfg._attn_implementation = "sdpa"
        net = transformers.LlamaForCausalLM(hf_cfg)
    print(json.dumps({"attn_implementation": getattr(net.config, "_attn_implementation", "?"),
                      "torch": torch.__version__, "transformers": transformers.__version__}), flush=True)
    net = net.to(device="cuda", dtype=torch.float32).train()
    opt = torch.optim.AdamW(net.parameters(), lr=train_cfg.get("lr", 3e-4), betas=(train_cfg.get("beta1", 0.9),
                            train_cfg.get("beta2", 0.95)), eps=train_cfg.get("eps", 1e-8),
                            weight_decay=train_cfg.get("weight_decay", 0.0))
    n_params = sum(p.numel() for p in net.parameters())  # tied embedding counted once, as ours

    def measure(s, warmup, iters):
        step_s, peak = run_steps(net, opt, model_cfg, train_cfg, batch, s, warmup, iters)
        tflops = step_flops(model_cfg, n_params, batch, s) / step_s / 1e12
        row = {"seq_len": s, "batch": batch, "step_ms": step_s * 1e3, "tokens_per_sec": batch * s / step_s,
               "tflops": tflops, "mfu": tflops / a.peak_tflops, "peak_bytes": peak}
        print(json.dumps(row), flush=True)
        return row

    def fits(s):
        try:
            measure(s, 0, 1)
            return True
        except torch.cuda.OutOfMemoryError:
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            print(json.dumps({"seq_len": s, "oom": True}), flush=True)
            return False

    r = measure(seq, a.warmup, a.iters)
    summary = (f"{r['tokens_per_sec']:.0f} tok/s, MFU {r['mfu']:.3f}, peak {r['peak_bytes'] / 2**30:.1f} GiB "
               f"(torch {torch.__version__}, transformers {transformers.__version__})")
    print("summary:", summary, flush=True)  # again below with the longest S: a timeout keeps this one
    if a.longest:
        lo, hi = seq, seq * 2
        while fits(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 4096:
            mid = (lo + hi) // 2 // 4096 * 4096
            if fits(mid):
                lo = mid
            else:
                hi = mid
        summary += f"; longest S {lo} (S {hi} runs out of memory)"
        print("summary:", summary, flush=True)


if __name__ == "__main__":
    sys.exit(main())
