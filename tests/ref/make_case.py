#!/usr/bin/python3
"""Write a random test case for model_ref.py / the C++ model: weights with Hugging Face names and a batch.

  /usr/bin/python3 tests/ref/make_case.py --config CFG.json --seed 0 --dtype float64 \
      --weights W.safetensors --batch IN.safetensors [--batch-size B] [--seq-len S] \
      [--ignore-frac 0.2] [--position-offset K] [--std 0.02] [--no-prefix] [--with-buffers]

Weights: N(0, --std=0.02) for embeddings, matrices and biases; norm weights 1 + N(0, 0.1).
Batch:   a random token stream t[0..S] per row; input_ids = t[:S], labels = t[1:S+1] (already shifted,
         as the data loader does) with about --ignore-frac of them set to -100 (never all of them),
         position_ids = K + (0..S-1).  B and S default to the config's data.batch_size / data.seq_len,
         else 2 and 16.
--no-prefix     GPT-2 names without "transformer." (as some checkpoints store them)
--with-buffers  GPT-2: also write the "h.{i}.attn.bias"/"attn.masked_bias" buffers HF checkpoints carry
"""
import argparse
import collections
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402

import safetensors_io as st  # noqa: E402
import torch_models as tm  # noqa: E402


def make_weights(cfg, seed, dtype=torch.float64, prefix=True, buffers=False, std=0.02):
    """OrderedDict HF name -> tensor."""
    g = torch.Generator().manual_seed(seed)
    params = tm.init_params(cfg, g, dtype=dtype, std=std)
    out = collections.OrderedDict()
    for name, t in params.items():
        if cfg.arch == "gpt2" and not prefix:
            name = name[len("transformer."):]
        out[name] = t
        if cfg.arch == "gpt2" and buffers and name.endswith("ln_1.bias"):
            base = name[: -len("ln_1.bias")]
            P = cfg.max_position_embeddings
            out[base + "attn.bias"] = torch.ones(P, P).tril().view(1, 1, P, P).to(dtype)
            out[base + "attn.masked_bias"] = torch.tensor(-1e4, dtype=dtype)
    return out


def make_batch(cfg, seed, batch_size, seq_len, ignore_frac=0.2, position_offset=0):
    """dict input_ids, labels, position_ids: int64 [B, S]."""
    g = torch.Generator().manual_seed(seed + 7919)
    tokens = torch.randint(0, cfg.vocab_size, (batch_size, seq_len + 1), generator=g)
    input_ids = tokens[:, :seq_len].clone()
    labels = tokens[:, 1:].clone()
    drop = torch.rand(batch_size, seq_len, generator=g) < ignore_frac
    drop[0, 0] = False  # at least one valid target
    labels[drop] = -100
    pos = (torch.arange(seq_len, dtype=torch.int64) + position_offset).expand(batch_size, seq_len).clone()
    return {"input_ids": input_ids, "labels": labels, "position_ids": pos}


def main(argv=None):
    ap = argparse.ArgumentParser(description="write random HF-named weights and a batch")
    ap.add_argument("--config", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float64",
                    help="storage dtype of the weights")
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--ignore-frac", type=float, default=0.2)
    ap.add_argument("--position-offset", type=int, default=0)
    ap.add_argument("--no-prefix", action="store_true")
    ap.add_argument("--with-buffers", action="store_true")
    ap.add_argument("--std", type=float, default=0.02, help="std of the random weights (norm weights: 1 + N(0, 0.1))")
    args = ap.parse_args(argv)

    try:
        with open(args.config, encoding="utf-8") as f:
            doc = json.load(f)
        cfg = tm.ModelConfig(doc["model"] if "model" in doc else doc)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {args.config}: {e}", file=sys.stderr)
        return 2
    data = doc.get("data", {}) if isinstance(doc.get("data"), dict) else {}
    B = args.batch_size or data.get("batch_size") or 2
    S = args.seq_len or data.get("seq_len") or 16
    if cfg.arch == "gpt2" and S + args.position_offset > cfg.max_position_embeddings:
        print(f"error: seq_len {S} + position offset exceeds max_position_embeddings "
              f"{cfg.max_position_embeddings}", file=sys.stderr)
        return 2
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    w = make_weights(cfg, args.seed, dtype, prefix=not args.no_prefix, buffers=args.with_buffers, std=args.std)
    st.save(args.weights, w, {"format": "pt", "producer": "tests/ref/make_case.py", "seed": str(args.seed)})
    b = make_batch(cfg, args.seed, B, S, args.ignore_frac, args.position_offset)
    st.save(args.batch, b, {"producer": "tests/ref/make_case.py", "seed": str(args.seed)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
