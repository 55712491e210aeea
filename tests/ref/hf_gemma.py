#!/usr/bin/env python3
"""Gemma 2 training against Hugging Face transformers (4.44, float64) and under sequence parallelism.

A tiny Gemma2ForCausalLM (GQA, head_dim apart from hidden / heads, query_pre_attn_scalar apart from
head_dim, both softcaps small enough to bend, windows of 4 on layers 0 and 2 of 3 over sequences of
32: the window cuts) saved by save_pretrained; then
  1. autosp-train with model.from in float64 has transformers' loss at step 1 (within 1e-6) and,
     by --dump-grads, its gradient of every parameter (within 1e-5 of the largest: transformers
     computes RoPE's cos and sin in float32), also with runtime.tiled_loss (the final softcap
     inside the tiled loss); the same run with model.sliding_window null (full causal attention)
     does not;
  2. its checkpoint after step 1 loads in from_pretrained with no missing or unexpected keys, and
     transformers' loss with those weights is autosp's at step 2;
  3. with packed documents (data.document_mask), P = 2 (Ulysses), P = 4 as a ring of 4 and as
     Ulysses 2 x ring 2, and dp 2 x sp 2 have P = 1's loss and gradients (within 1e-10), for this
     Gemma 2 and for a Gemma 3 (text) of autosp's own random initialisation.
transformers' Gemma2RMSNorm computes in float32 even in a float64 model; the reference computes it
in float64 (hf_windows.float64_gemma_norms), as autosp does for float64. pad_token_id is None: with
Gemma2Config's default 0, nn.Embedding(padding_idx=0) leaves row 0 out of the embedding lookup's
gradient; step 1 also runs with model.pad_token_id 0 against transformers with padding_idx 0
(docs/decisions.md 183).
  hf_gemma.py BIN_DIR
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_common import compare_grads, skip, train_config  # noqa: E402

try:
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import Gemma2Config, Gemma2ForCausalLM
except ImportError as e:
    skip(e)
from hf_roundtrip import batch_tokens, check, run_autosp, write_tokens  # noqa: E402
from hf_windows import float64_gemma_norms  # noqa: E402

VOCAB, SEQ, BATCH, WINDOW = 96, 32, 2, 4
# (ranks, autosp_size, ring_size): P = 1 first
LAYOUTS = ((1, 1, 1), (2, 2, 1), (4, 4, 4), (4, 4, 2), (4, 2, 1))


def gemma2():
    torch.manual_seed(0)
    m = Gemma2ForCausalLM(Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=500.0,
                                       max_position_embeddings=64, sliding_window=WINDOW, query_pre_attn_scalar=24,
                                       attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                       pad_token_id=None, attn_implementation="eager"))
    with torch.no_grad():  # the norms' weights are w of (1 + w)
        for p in m.parameters():
            p.normal_(0.0, 0.2) if p.dim() >= 2 else p.normal_(0.0, 0.1)
    return m


def load_hf(path):
    """from_pretrained in float64 with eager attention (4.44's SDPA path drops the attention
    softcap), refusing missing, unexpected or mismatched keys."""
    model, info = Gemma2ForCausalLM.from_pretrained(path, torch_dtype=torch.float64, attn_implementation="eager",
                                                    output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info[kind], f"{path}: from_pretrained reports {kind} {info[kind]}"
    return model.eval()


def loss_of(model, x):
    """Token-mean loss of x [B, S + 1] with Gemma's final softcap, in the model's dtype (the
    forward would cast the logits to float32)."""
    hidden = model.model(input_ids=x[:, :-1], use_cache=False)[0]
    logits = model.lm_head(hidden)
    cap = model.config.final_logit_softcapping
    logits = torch.tanh(logits / cap) * cap
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def config(work, src, steps=1, batch=BATCH, **more):
    return train_config(work, src, SEQ, batch, steps, **more)


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
    transformers.utils.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    float64_gemma_norms()
    work = tempfile.mkdtemp(prefix="autosp-hf-gemma-")
    try:
        tokens = write_tokens(os.path.join(work, "tokens.bin"), 4096, VOCAB)
        src = os.path.join(work, "gemma2")
        gemma2().save_pretrained(src, safe_serialization=True)
        ref = load_hf(src)
        x = batch_tokens(tokens, 0, BATCH, SEQ)
        loss = loss_of(ref, x)
        loss.backward()
        theirs = {n: p.grad for n, p in ref.named_parameters()}

        # 1. loss and gradients; full causal attention differs
        grads = os.path.join(work, "grads.safetensors")
        ckpt = os.path.join(work, "ckpt")
        m = run_autosp(bin_dir, work, config(work, src, steps=2, train={"checkpoint_dir": ckpt, "checkpoint_every": 1,
                                                                           "keep_checkpoints": 0}),
                       extra=["--dump-grads", grads], name="p1")
        check("gemma2 step 1 (model.from)", m[0]["loss"], loss.item())
        compare_grads("gemma2 step 1 gradients", load_file(grads), theirs, 1e-5)
        # the tiled loss caps its chunks of logits itself (decision 178): the same loss and gradients,
        # with no [B, S, V] logits
        tiled_grads = os.path.join(work, "grads-tiled.safetensors")
        tiled = run_autosp(bin_dir, work, config(work, src, runtime={"tiled_loss": True}),
                           extra=["--dump-grads", tiled_grads], name="tiled")
        check("gemma2 step 1, runtime.tiled_loss", tiled[0]["loss"], loss.item())
        compare_grads("gemma2 step 1 gradients, runtime.tiled_loss", load_file(tiled_grads), theirs, 1e-5)
        # HF's padding_idx (decision 183): with pad_token_id 0, nn.Embedding leaves row 0 out of the
        # lookup's gradient (the tied head still trains it); the tokens hold 0, so row 0 differs
        padded = load_hf(src)
        padded.model.embed_tokens.padding_idx = 0
        loss_of(padded, x).backward()
        theirs_pad = {n: p.grad for n, p in padded.named_parameters()}
        emb = "model.embed_tokens.weight"
        assert (theirs_pad[emb][0] - theirs[emb][0]).abs().max() > 1e-3, "token 0 does not reach the lookup"
        pad_grads = os.path.join(work, "grads-pad.safetensors")
        run_autosp(bin_dir, work, config(work, src, model={"pad_token_id": 0}), extra=["--dump-grads", pad_grads],
                   name="pad")
        compare_grads("gemma2 step 1 gradients, model.pad_token_id 0", load_file(pad_grads), theirs_pad, 1e-5)
        # bf16 (its own embedding launcher): row 0 loses the lookup's part, transformers' row-0
        # difference, within bf16's rounding (5% of that difference's size)
        rows0 = []
        for pad in (None, 0):
            path = os.path.join(work, f"grads-bf16-pad{pad}.safetensors")
            run_autosp(bin_dir, work, config(work, src, model={"pad_token_id": pad}, runtime={"dtype": "bfloat16"}),
                       extra=["--dump-grads", path], name=f"bf16-pad{pad}")
            rows0.append(load_file(path)[emb][0].to(torch.float64))
        want = theirs[emb][0] - theirs_pad[emb][0]
        err = ((rows0[0] - rows0[1]) - want).norm() / want.norm()
        print(f"gemma2 bf16, model.pad_token_id 0: row 0's lookup gradient removed, relative error {err:.2e}")
        assert err < 5e-2, f"bf16 padding_idx: row 0 changed by {rows0[0] - rows0[1]}, transformers' {want}"
        full = run_autosp(bin_dir, work, config(work, src, model={"sliding_window": None}), name="full")[0]["loss"]
        print(f"gemma2 with full causal attention: {full:.12f}")
        assert abs(full - loss.item()) > 1e-3, "the window does not change the loss"

        # 2. the checkpoint in from_pretrained
        back = load_hf(os.path.join(ckpt, "step_00000001"))
        with torch.no_grad():
            check("gemma2 from_pretrained(step_1) at step 2", m[1]["loss"], loss_of(back, batch_tokens(tokens, 1, BATCH, SEQ)).item())

        # 3. sequence parallel with packed documents: P = 1's loss and gradients, for this Gemma 2
        # and for a Gemma 3 of autosp's own initialisation (q/k norms, local RoPE base, linear
        # scaling on the global layer; transformers 4.44 has no Gemma 3)
        eos = int(torch.tensor(tokens[:4 * BATCH * SEQ]).bincount().argmax())  # a frequent token: documents are short
        gemma3 = {"arch": "gemma3_text", "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48,
                  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                  "sliding_window": WINDOW, "sliding_window_pattern": 3, "rope_local_base_freq": 50.0,
                  "rope_scaling": {"rope_type": "linear", "factor": 4.0}, "query_pre_attn_scalar": 12,
                  "final_logit_softcapping": 3.0}
        for name, model in (("gemma2", {"from": src}), ("gemma3_text", gemma3)):
            base = None
            for ranks, sp, ring in LAYOUTS:
                dp = ranks // sp
                path = os.path.join(work, f"grads-{name}-{ranks}-{sp}-{ring}.safetensors")
                c = config(work, src, batch=2 * BATCH // dp, data={"document_mask": True, "eos_token_id": eos},
                           sequence_parallel={"autosp_size": sp, "ring_size": ring})
                c["model"] = model
                got = run_autosp(bin_dir, work, c, np_=ranks, extra=["--dump-grads", path],
                                 name=f"docs-{name}-{ranks}-{sp}-{ring}")
                g = {n: t.to(torch.float64) for n, t in load_file(path).items()}
                if base is None:
                    base = (got[0]["loss"], g)
                    continue
                what = f"{name} packed documents, {ranks} ranks: dp {dp} x Ulysses {sp // ring} x ring {ring} (against P = 1)"
                diff = abs(got[0]["loss"] - base[0])
                print(f"{what}: loss {got[0]['loss']:.12f}, P = 1's {base[0]:.12f}, |diff| {diff:.2e}")
                assert diff <= 1e-10 * abs(base[0]), f"{what}: the loss differs from P = 1's by {diff}"
                compare_grads(what, g, base[1], 1e-10)
        print("hf gemma: ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
