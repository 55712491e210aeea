#!/usr/bin/env python3
"""autosp-eval --perplexity-by-position against Hugging Face transformers in float64: tiny Llamas
(GQA; one with YaRN rope scaling evaluated past its original positions) built by transformers, saved
with save_pretrained and read back by `autosp-eval --model DIR`; transformers' per-token losses
(the head applied to the base model's float64 hidden states, cross_entropy with reduction "none")
over the same windows of an llm.c token shard, bucketed by position, must equal ours at P = 1 and
under mpirun at P = 2 and 4. Needs the venv of scripts/hf-venv.sh (exit 77, a ctest skip, without it).
  hf_eval.py BIN_DIR
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_common import launch, skip  # noqa: E402

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
except ImportError as e:
    skip(e)
from hf_roundtrip import write_tokens  # noqa: E402  (an llm.c shard of random tokens)

VOCAB, SEQUENCES, WIDTH = 80, 3, 16
# Relative. Both sides compute in float64, except that transformers makes its RoPE tables in float32
# (inv_freq and cos/sin), which moves losses by ~1e-8; a position off by one moves them by > 1e-2.
TOL = 1e-6


def models():
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rope_theta=500.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
    torch.manual_seed(0)
    plain = LlamaForCausalLM(LlamaConfig(**base, max_position_embeddings=64))
    yarn = LlamaForCausalLM(LlamaConfig(**base, max_position_embeddings=32,
                                        rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    for m in (plain, yarn):  # HF's init (std 0.02) leaves every loss near log V: larger weights tell more
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0.0, 0.2) if p.dim() >= 2 else p.normal_(1.0, 0.1)
    # name: (model, S, the P to run)
    return {"llama": (plain, 48, (1, 2, 4)), "llama-yarn": (yarn, 96, (1, 2))}


def reference(model, tokens, S):
    """Bucketed (sum, count) of transformers' float64 per-token losses over windows 0..SEQUENCES-1."""
    buckets = [[0.0, 0] for _ in range((S + WIDTH - 1) // WIDTH)]
    for g in range(SEQUENCES):
        x = torch.tensor(tokens[g * S:g * S + S + 1], dtype=torch.int64)[None]
        with torch.no_grad():
            hidden = model.base_model(input_ids=x[:, :-1])[0]
            logits = model.get_output_embeddings()(hidden)  # float64 (the model's forward casts to float32)
            cap = getattr(model.config, "final_logit_softcapping", None)  # Gemma's, as its forward applies it
            if cap:
                logits = torch.tanh(logits / cap) * cap
            loss = torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="none")
        for t, v in enumerate(loss.tolist()):
            buckets[t // WIDTH][0] += v
            buckets[t // WIDTH][1] += 1
    return buckets


def run_eval(bin_dir, src, shard, S, P, extra=()):
    cmd = [os.path.join(bin_dir, "autosp-eval"), "--model", src, "--data", shard, "--seq-len", str(S),
           "--perplexity-by-position", "--bucket-width", str(WIDTH), "--sequences", str(SEQUENCES), "--quiet",
           "--set", "runtime.dtype=float64", "--set", "data.batch_size=1",
           "--set", f"sequence_parallel.autosp_size={P}", *extra]
    return json.loads(launch(cmd, P))


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
    transformers.utils.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    work = tempfile.mkdtemp(prefix="autosp-hf-eval-")
    try:
        shard = os.path.join(work, "tokens.bin")
        tokens = write_tokens(shard, 4096, VOCAB)
        for name, (model, S, parallel) in models().items():
            src = os.path.join(work, name)
            model.save_pretrained(src, safe_serialization=True)  # float32 weights
            ref = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float64).eval()
            want = reference(ref, tokens, S)
            for P in parallel:
                got = run_eval(bin_dir, src, shard, S, P)["buckets"]
                assert len(got) == len(want), (name, P, len(got), len(want))
                worst = 0.0
                for b, (g, (s, n)) in enumerate(zip(got, want)):
                    assert g["tokens"] == n and (g["start"], g["end"]) == (b * WIDTH, min(S, (b + 1) * WIDTH)), (g, n)
                    diff = abs(g["loss"] - s / n)
                    worst = max(worst, diff / abs(s / n))
                    assert diff <= TOL * abs(s / n), f"{name} P={P} bucket {b}: autosp {g['loss']} transformers {s / n}"
                losses = ", ".join("%.6f" % g["loss"] for g in got)
                print(f"{name} S={S} P={P}: {len(got)} buckets equal transformers' ({losses}; "
                      f"largest relative difference {worst:.1e})")
        print("hf eval: ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
