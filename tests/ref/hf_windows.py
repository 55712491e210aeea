#!/usr/bin/env python3
"""Sliding-window attention against Hugging Face transformers in float64: a tiny Mistral with
sliding_window 8 (eager attention, whose mask hides key j from query i when j <= i - 8) and a tiny
Gemma 2 (windows of 8 on layers 0 and 2, both softcaps, query_pre_attn_scalar), built by
transformers, saved with save_pretrained and read back by `autosp-eval --model DIR`. Their per-token
losses over S = 48 (the window cuts: six times shorter than the sequence), bucketed by position,
must equal transformers' at P = 1, under mpirun at P = 2 (Ulysses), and at P = 4 as a ring of 4 and
as Ulysses 2 x ring 2 (chunks of 6 and 12 tokens: the window crosses every shard boundary). The
same weights without the window (full causal attention) must differ, so the window is really applied.
Needs the venv of scripts/hf-venv.sh (exit 77, a ctest skip, without it).
  hf_windows.py BIN_DIR
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_common import skip  # noqa: E402

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM
except ImportError as e:
    skip(e)
from hf_eval import TOL, VOCAB, reference, run_eval  # noqa: E402
from hf_roundtrip import write_tokens  # noqa: E402

S, WINDOW = 48, 8
# (P, ring_size)
LAYOUTS = ((1, 1), (2, 1), (4, 4), (4, 2))


def mistral(window):
    torch.manual_seed(0)
    m = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, rope_theta=500.0,
                                         max_position_embeddings=64, sliding_window=window,
                                         attn_implementation="eager"))
    with torch.no_grad():  # larger than HF's init, so that positions tell
        for p in m.parameters():
            p.normal_(0.0, 0.2) if p.dim() >= 2 else p.normal_(1.0, 0.1)
    return m


def gemma2(window):
    torch.manual_seed(0)
    m = Gemma2ForCausalLM(Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=500.0,
                                       max_position_embeddings=64, sliding_window=window, query_pre_attn_scalar=12,
                                       attn_logit_softcapping=3.0, final_logit_softcapping=4.0,
                                       attn_implementation="eager"))
    with torch.no_grad():  # the norms' weights are w of (1 + w)
        for p in m.parameters():
            p.normal_(0.0, 0.2) if p.dim() >= 2 else p.normal_(0.0, 0.1)
    return m


def float64_gemma_norms():
    """transformers' Gemma2RMSNorm computes in float32 (x.float()) even in a float64 model, as a
    bf16 model's; autosp keeps a float64 model in float64. The reference does too: the same
    equation, in at least float32."""
    from transformers.models.gemma2 import modeling_gemma2

    def forward(self, x):
        t = torch.promote_types(x.dtype, torch.float32)
        return (self._norm(x.to(t)) * (1.0 + self.weight.to(t))).type_as(x)
    modeling_gemma2.Gemma2RMSNorm.forward = forward


# name -> (the model with a window, the window that leaves it full causal)
MODELS = {"mistral": (mistral, None), "gemma2": (gemma2, 4096)}


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
    transformers.utils.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    work = tempfile.mkdtemp(prefix="autosp-hf-windows-")
    try:
        shard = os.path.join(work, "tokens.bin")
        tokens = write_tokens(shard, 4096, VOCAB)
        float64_gemma_norms()
        for name, (make, full_window) in MODELS.items():
            src = os.path.join(work, name)
            make(WINDOW).save_pretrained(src, safe_serialization=True)
            ref = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float64, attn_implementation="eager").eval()
            want = reference(ref, tokens, S)
            full = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float64, attn_implementation="eager",
                                                        sliding_window=full_window).eval()
            without = reference(full, tokens, S)
            for P, ring in LAYOUTS:
                got = run_eval(bin_dir, src, shard, S, P, ["--set", f"sequence_parallel.ring_size={ring}"])["buckets"]
                assert len(got) == len(want), (name, P, ring, len(got), len(want))
                worst, apart = 0.0, 0.0
                for b, (g, (s, n), (s0, n0)) in enumerate(zip(got, want, without)):
                    diff = abs(g["loss"] - s / n)
                    worst = max(worst, diff / abs(s / n))
                    apart = max(apart, abs(g["loss"] - s0 / n0) / abs(s0 / n0))
                    assert diff <= TOL * abs(s / n), \
                        f"{name} P={P} ring {ring} bucket {b}: autosp {g['loss']} transformers {s / n}"
                assert apart > 1e-3, f"{name} P={P} ring {ring}: full causal attention gives the same losses ({apart:.1e})"
                print(f"{name} window {WINDOW} S={S} P={P} ring {ring}: {len(got)} buckets equal transformers' "
                      f"(largest relative difference {worst:.1e}; full attention's differ by up to {apart:.1e})")
        print("hf windows: ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
