#!/usr/bin/env python3
"""autosp-sample against Hugging Face transformers' generate (greedy, use_cache=True): a tiny random
GPT-2 and a tiny Llama with GQA, built by transformers in float64, saved with save_pretrained, our
config translated by hand; the greedy tokens must agree token for token, with the KV cache and
without it (--no-kv-cache recomputes the whole sequence), and seeded sampling must be
reproducible. Needs the venv of scripts/hf-venv.sh (exit 77, a ctest skip, without it).
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


def sample(bin_dir, cfg_path, weights, prompt, *extra):
    out = subprocess.run([os.path.join(bin_dir, "autosp-sample"), "--config", cfg_path, "--init-from", weights,
                          "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(NEW_TOKENS),
                          "--dtype", "float64", "--json", *extra], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"autosp-sample failed ({out.returncode}): {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])["ids"]


def main():
    bin_dir = sys.argv[1]
    torch.manual_seed(0)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("gpt2", gpt2), ("llama-gqa", llama)):
            model, ours = make(97)
            model = model.double().eval()
            with torch.no_grad():  # weights large enough that the greedy argmax is never a near tie
                for p in model.parameters():
                    if p.dim() >= 2:
                        p.normal_(0, 0.3)
            d = os.path.join(tmp, name)
            model.save_pretrained(d, safe_serialization=True)
            cfg_path = os.path.join(tmp, name + ".json")
            with open(cfg_path, "w") as f:
                json.dump({"model": ours, "data": {"seq_len": 16, "batch_size": 1},
                           "runtime": {"dtype": "float64"}}, f)
            weights = os.path.join(d, "model.safetensors")
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
    print("FAIL" if failures else "PASS")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
