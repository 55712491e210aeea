#!/usr/bin/env python3
"""autosp-sample against Hugging Face transformers' generate (greedy, use_cache=True): a tiny random
GPT-2 and a tiny Llama with GQA, built by transformers in float64, saved with save_pretrained, our
config translated by hand; the greedy tokens must agree token for token, with the KV cache and
without it (--no-kv-cache recomputes the whole sequence), and seeded sampling must be
reproducible. A tiny Qwen2 (q/k/v biases, tied head) and a Mistral (head_dim apart from
hidden / heads) go in as the saved directory itself, `autosp-sample --model DIR`. Qwen3, which
transformers 4.44 lacks, goes in the same way from a config.json in transformers 5's format, and its
greedy tokens are checked against greedy decoding with the float64 reference
(tests/ref/torch_models.py, the whole sequence recomputed per token). Needs the venv of scripts/hf-venv.sh (exit 77, a ctest skip, without it).
  hf_generate.py BIN_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
except ImportError:
    print("skip: no transformers (scripts/hf-venv.sh creates its venv)")
    sys.exit(77)

NEW_TOKENS = 24


def gpt2(vocab):
    cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                  resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    ours = {"arch": "gpt2", "vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 64, "norm_eps": 1e-5}
    return transformers.GPT2LMHeadModel(cfg), ours


def llama(vocab):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rope_theta=500.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
    ours = {"arch": "llama", "vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
            "max_position_embeddings": 128, "rope_theta": 500.0, "norm_eps": 1e-6, "tie_word_embeddings": False}
    return transformers.LlamaForCausalLM(cfg), ours


def qwen2(vocab):
    cfg = transformers.Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rope_theta=1000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
    return transformers.Qwen2ForCausalLM(cfg), None  # None: autosp-sample --model DIR


def mistral(vocab):
    cfg = transformers.MistralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=None,
                                     max_position_embeddings=128, rope_theta=500.0, tie_word_embeddings=False)
    return transformers.MistralForCausalLM(cfg), None


def sample(bin_dir, cfg_path, weights, prompt, *extra):
    source = ["--config", cfg_path, "--init-from", weights] if cfg_path else ["--model", weights]
    out = subprocess.run([os.path.join(bin_dir, "autosp-sample"), *source,
                          "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(NEW_TOKENS),
                          "--dtype", "float64", "--json", *extra], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"autosp-sample failed ({out.returncode}): {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])["ids"]


def qwen3_against_reference(bin_dir, tmp):
    """autosp-sample --model on a Qwen3 directory (transformers 5's config.json) against greedy decoding
    with the float64 reference. Returns the number of mismatches (0 or 1)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import safetensors_io as st
    import torch_models as tm
    ours = {"arch": "qwen3", "vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48, "max_position_embeddings": 128,
            "rope_theta": 1000.0, "norm_eps": 1e-6, "tie_word_embeddings": False}
    cfg = tm.ModelConfig(ours)
    params = tm.init_params(cfg, torch.Generator().manual_seed(3), dtype=torch.float64, std=0.3)
    d = os.path.join(tmp, "qwen3")
    os.makedirs(d)
    st.save(os.path.join(d, "model.safetensors"), dict(params), {"format": "pt"})
    hf = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 97, "hidden_size": 32,
          "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}, "attention_bias": False,
          "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
          "layer_types": ["full_attention"] * 2, "tie_word_embeddings": False, "dtype": "float64",
          "transformers_version": "5.24.0"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf, f)
    prompt = [5, 17, 42, 3, 88, 61, 9]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            x = torch.tensor([ids])
            logits = tm.forward(cfg, params, x, torch.arange(len(ids))[None])
            ids.append(int(logits[0, -1].argmax()))
    ref = ids[len(prompt):]
    got = sample(bin_dir, None, d, prompt)
    print(f"qwen3 --model (transformers 5 config.json) prompt {prompt}: {'ok' if got == ref else 'MISMATCH'}\n"
          f"  ref   {ref}\n  cache {got}")
    return int(got != ref)


def main():
    bin_dir = sys.argv[1]
    torch.manual_seed(0)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("gpt2", gpt2), ("llama-gqa", llama), ("qwen2", qwen2), ("mistral-head-dim", mistral)):
            model, ours = make(97)
            model = model.double().eval()
            with torch.no_grad():  # weights large enough that the greedy argmax is never a near tie
                for pname, p in model.named_parameters():
                    if p.dim() >= 2:
                        p.normal_(0, 0.3)
                    elif pname.endswith(".bias") and ours is None:  # Qwen2's q/k/v biases (HF inits them 0)
                        p.normal_(0, 0.3)
            d = os.path.join(tmp, name)
            model.save_pretrained(d, safe_serialization=True)
            cfg_path = None
            weights = d
            if ours is not None:
                cfg_path = os.path.join(tmp, name + ".json")
                with open(cfg_path, "w") as f:
                    json.dump({"model": ours, "data": {"seq_len": 16, "batch_size": 1},
                               "runtime": {"dtype": "float64"}}, f)
                weights = os.path.join(d, "model.safetensors")
            if ours is None:  # the directory alone: one prompt (the family's graph is what is new)
                prompt = [5, 17, 42, 3, 88, 61, 9]
                with torch.no_grad():
                    ids = torch.tensor([prompt])
                    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                         min_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                                         pad_token_id=0)[0, len(prompt):].tolist()
                got = sample(bin_dir, None, d, prompt)
                failures += got != ref
                print(f"{name} --model prompt {prompt}: {'ok' if got == ref else 'MISMATCH'}\n  hf    {ref}\n  cache {got}")
                continue
            for prompt in ([5, 17, 42, 3, 88, 61, 9], [1]):
                with torch.no_grad():
                    ids = torch.tensor([prompt])
                    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                         min_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                                         pad_token_id=0)[0, len(prompt):].tolist()
                got = sample(bin_dir, cfg_path, weights, prompt)
                full = sample(bin_dir, cfg_path, weights, prompt, "--no-kv-cache")
                ok = got == ref and full == ref
                failures += not ok
                print(f"{name} prompt {prompt}: {'ok' if ok else 'MISMATCH'}\n  hf    {ref}\n  cache {got}\n  full  {full}")
            a = sample(bin_dir, cfg_path, weights, [5, 17], "--temperature", "1.5", "--top-k", "20", "--seed", "7")
            b = sample(bin_dir, cfg_path, weights, [5, 17], "--temperature", "1.5", "--top-k", "20", "--seed", "7")
            c = sample(bin_dir, cfg_path, weights, [5, 17], "--temperature", "1.5", "--top-k", "20", "--seed", "8")
            seeded = a == b and a != c and len(a) == NEW_TOKENS
            failures += not seeded
            print(f"{name} seeded sampling: {'ok' if seeded else 'FAIL'} (seed 7 twice {a == b}, seed 8 differs {a != c})")
        failures += qwen3_against_reference(bin_dir, tmp)
    print("FAIL" if failures else "PASS")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
