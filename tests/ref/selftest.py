#!/usr/bin/python3
"""Self-tests for the PyTorch reference (tests/ref). Run: /usr/bin/python3 tests/ref/selftest.py
Exits non-zero on failure.

1. safetensors_io round trip and byte-level checks.
2. An independent float64 numpy implementation of both models (explicit per-batch, per-head,
   per-position loops; RoPE as explicit pair rotations; GQA by index arithmetic) must agree with
   torch_models to ~1e-12, and finite differences of the numpy loss must agree with the autograd
   gradients that model_ref.py writes.
3. model_ref.py end to end through make_case.py files: GPT-2 with/without the "transformer." prefix
   and with HF attn.bias buffers; Llama with GQA + untied head, MQA, tied head; float32 vs float64;
   error exits (missing weight, shape mismatch, bad config) with code 2 and an "error:" line.
4. train_ref.py (tests/ref/selftest_train.py): LR schedule, AdamW param groups, clipping, a numpy float64
   AdamW vs torch.optim.AdamW, and the CLI.
"""
import math
import os
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import make_case  # noqa: E402
import model_ref  # noqa: E402
import safetensors_io as st  # noqa: E402
import selftest_train  # noqa: E402
import torch_models as tm  # noqa: E402

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2") or 2))

# One tally for this file's checks and selftest_train.py's, which main() runs too.
FAILURES, CHECKS, check = selftest_train.FAILURES, selftest_train.CHECKS, selftest_train.check
write_json, run_main = selftest_train.write_json, selftest_train.run_main


def close(a, b, rtol, atol, what):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ok = a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=atol)
    err = float(np.max(np.abs(a - b))) if a.shape == b.shape and a.size else float("nan")
    check(ok, f"{what}: max abs diff {err:.3e} (shapes {a.shape} vs {b.shape})")
    return err


# ---------------------------------------------------------------------------------------------------
# independent numpy float64 models (no torch, loops instead of batched ops)

def np_softmax_row(z):
    m = max(z)
    e = np.exp(np.asarray(z) - m)
    return e / e.sum()


def np_causal_head(q, k, v):
    """q, k, v [S, D] for one head -> [S, D], explicit loop over query positions."""
    S, D = q.shape
    o = np.zeros_like(q)
    for t in range(S):
        scores = [float(np.dot(q[t], k[s])) / math.sqrt(D) for s in range(t + 1)]
        p = np_softmax_row(scores)
        for s in range(t + 1):
            o[t] += p[s] * v[s]
    return o


def np_loss(logits, labels):
    total, n = 0.0, 0
    B, S, V = logits.shape
    for b in range(B):
        for t in range(S):
            y = int(labels[b, t])
            if y == -100:
                continue
            z = logits[b, t]
            m = z.max()
            total += (m + math.log(np.exp(z - m).sum())) - z[y]
            n += 1
    return total / n, total, n


def np_layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def np_gpt2(cfg, W, ids, pos):
    B, S = ids.shape
    C, N, D, eps = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.norm_eps
    g = lambda n: W["transformer." + n]  # noqa: E731
    x = np.stack([np.stack([g("wte.weight")[ids[b, t]] + g("wpe.weight")[pos[b, t]] for t in range(S)])
                  for b in range(B)])
    for i in range(cfg.num_hidden_layers):
        p = f"h.{i}."
        a = np_layernorm(x, g(p + "ln_1.weight"), g(p + "ln_1.bias"), eps)
        qkv = a @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")
        att = np.zeros_like(x)
        for b in range(B):
            for n in range(N):
                q = qkv[b, :, n * D:(n + 1) * D]
                k = qkv[b, :, C + n * D:C + (n + 1) * D]
                v = qkv[b, :, 2 * C + n * D:2 * C + (n + 1) * D]
                att[b, :, n * D:(n + 1) * D] = np_causal_head(q, k, v)
        x = x + att @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        m = np_layernorm(x, g(p + "ln_2.weight"), g(p + "ln_2.bias"), eps)
        h = m @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias")
        h = 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
        x = x + h @ g(p + "mlp.c_proj.weight") + g(p + "mlp.c_proj.bias")
    x = np_layernorm(x, g("ln_f.weight"), g("ln_f.bias"), eps)
    return x @ g("wte.weight").T


def np_rope_head(x, positions, theta):
    """x [S, D]: rotate pair (j, j + D/2) by angle pos * theta^(-2j/D)."""
    S, D = x.shape
    half = D // 2
    y = np.empty_like(x)
    for t in range(S):
        for j in range(half):
            ang = float(positions[t]) * theta ** (-2.0 * j / D)
            c, s = math.cos(ang), math.sin(ang)
            a, b = x[t, j], x[t, j + half]
            y[t, j] = a * c - b * s
            y[t, j + half] = b * c + a * s
    return y


def np_llama(cfg, W, ids, pos):
    B, S = ids.shape
    N, Nkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.norm_eps
    group = N // Nkv

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    x = np.stack([W["model.embed_tokens.weight"][ids[b]] for b in range(B)])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        att = np.zeros((B, S, N * D))
        for b in range(B):
            qa = h[b] @ W[p + "self_attn.q_proj.weight"].T
            ka = h[b] @ W[p + "self_attn.k_proj.weight"].T
            va = h[b] @ W[p + "self_attn.v_proj.weight"].T
            for n in range(N):
                kvh = n // group
                q = np_rope_head(qa[:, n * D:(n + 1) * D], pos[b], cfg.rope_theta)
                k = np_rope_head(ka[:, kvh * D:(kvh + 1) * D], pos[b], cfg.rope_theta)
                v = va[:, kvh * D:(kvh + 1) * D]
                att[b, :, n * D:(n + 1) * D] = np_causal_head(q, k, v)
        x = x + att @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        gte = h @ W[p + "mlp.gate_proj.weight"].T
        up = h @ W[p + "mlp.up_proj.weight"].T
        x = x + ((gte / (1.0 + np.exp(-gte))) * up) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if cfg.tie_word_embeddings else W["lm_head.weight"]
    return x @ head.T


def np_forward(cfg, W, ids, pos):
    return np_gpt2(cfg, W, ids, pos) if cfg.arch == "gpt2" else np_llama(cfg, W, ids, pos)


# ---------------------------------------------------------------------------------------------------
# helpers

def run_ref(argv):
    """model_ref.main in-process; returns (rc, stderr text)."""
    return run_main(model_ref.main, argv)


def canonical_np(cfg, weights):
    out = {}
    for k, v in weights.items():
        if k.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if cfg.arch == "gpt2" and not k.startswith("transformer."):
            k = "transformer." + k
        out[k] = v.double().numpy().copy()
    return out


def fd_check(cfg, W_np, batch, grads, file_names, tag, rng, per_tensor=2, h=1e-5):
    """Central finite differences of the numpy loss vs the autograd gradients."""
    ids, pos, labels = (batch[k].numpy() for k in ("input_ids", "position_ids", "labels"))
    worst = 0.0
    for canon, fname in file_names.items():
        g = grads["grad." + fname].double().numpy()
        for _ in range(per_tensor):
            idx = tuple(int(rng.integers(0, d)) for d in W_np[canon].shape)
            orig = W_np[canon][idx]
            W_np[canon][idx] = orig + h
            lp = np_loss(np_forward(cfg, W_np, ids, pos), labels)[0]
            W_np[canon][idx] = orig - h
            lm = np_loss(np_forward(cfg, W_np, ids, pos), labels)[0]
            W_np[canon][idx] = orig
            fd = (lp - lm) / (2 * h)
            err = abs(fd - g[idx])
            worst = max(worst, err / max(1e-3, abs(fd)))
            check(err <= 1e-8 + 1e-5 * abs(fd), f"{tag}: FD grad {fname}{list(idx)}: fd {fd:.10e} "
                                                 f"autograd {g[idx]:.10e}")
    return worst


# ---------------------------------------------------------------------------------------------------

def case(tmp, tag, model, B=2, S=7, seed=1, prefix=True, buffers=False, pos_offset=0, store=torch.float64,
         fd=True, std=0.02):
    """make_case -> model_ref (float64 + grads, float32) -> compare with numpy. Returns outputs."""
    t0 = time.time()
    cfg = tm.ModelConfig(model)
    cfg_path = os.path.join(tmp, f"{tag}.json")
    write_json(cfg_path, {"model": model, "data": {"batch_size": B, "seq_len": S}})
    wpath, bpath = os.path.join(tmp, f"{tag}.w.safetensors"), os.path.join(tmp, f"{tag}.in.safetensors")
    argv = ["--config", cfg_path, "--seed", str(seed), "--dtype", "float64" if store == torch.float64 else
            "float32", "--weights", wpath, "--batch", bpath, "--position-offset", str(pos_offset)]
    argv += [] if prefix else ["--no-prefix"]
    argv += ["--with-buffers"] if buffers else []
    argv += ["--std", str(std)]
    check(make_case.main(argv) == 0, f"{tag}: make_case")
    weights, _ = st.load(wpath)
    batch, _ = st.load(bpath)
    out64 = os.path.join(tmp, f"{tag}.out64.safetensors")
    out32 = os.path.join(tmp, f"{tag}.out32.safetensors")
    rc, err = run_ref(["--config", cfg_path, "--weights", wpath, "--batch", bpath, "--dtype", "float64",
                       "--out", out64, "--grads"])
    check(rc == 0, f"{tag}: model_ref float64 rc={rc} {err}")
    rc, err = run_ref(["--config", cfg_path, "--weights", wpath, "--batch", bpath, "--dtype", "float32",
                       "--out", out32])
    check(rc == 0, f"{tag}: model_ref float32 rc={rc} {err}")
    r64, meta = st.load(out64)
    r32, _ = st.load(out32)

    # structure
    V = cfg.vocab_size
    check(tuple(r64["logits"].shape) == (B, S, V) and r64["logits"].dtype == torch.float64, f"{tag}: logits")
    check(r32["logits"].dtype == torch.float32 and r32["loss"].dtype == torch.float32, f"{tag}: f32 dtypes")
    for k in ("loss", "loss_sum", "valid_count"):
        check(tuple(r64[k].shape) == (), f"{tag}: {k} is a scalar")
    check(r64["valid_count"].dtype == torch.int64, f"{tag}: valid_count I64")
    n_valid = int((batch["labels"] != -100).sum())
    check(int(r64["valid_count"]) == n_valid, f"{tag}: valid_count {int(r64['valid_count'])} != {n_valid}")
    check(abs(float(r64["loss"]) - float(r64["loss_sum"]) / n_valid) < 1e-14, f"{tag}: loss = sum/count")
    # torch's own mean cross-entropy agrees
    ce = torch.nn.functional.cross_entropy(r64["logits"].reshape(-1, V), batch["labels"].reshape(-1),
                                           ignore_index=-100)
    close(float(ce), float(r64["loss"]), 1e-13, 1e-13, f"{tag}: loss vs F.cross_entropy mean")
    params = [k for k in weights if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    grad_keys = sorted(k for k in r64 if k.startswith("grad."))
    check(grad_keys == sorted("grad." + k for k in params), f"{tag}: grad names {grad_keys[:3]}...")
    check(not any(k.startswith("grad.") for k in r32), f"{tag}: no grads without --grads")
    for k in params:
        g = r64.get("grad." + k)
        check(g is not None and tuple(g.shape) == tuple(weights[k].shape) and g.dtype == torch.float64
              and bool(torch.isfinite(g).all()), f"{tag}: grad.{k} shape/dtype/finite")

    # independent numpy forward
    W_np = canonical_np(cfg, weights)
    ids, pos, labels = (batch[k].numpy() for k in ("input_ids", "position_ids", "labels"))
    ref_logits = np_forward(cfg, W_np, ids, pos)
    ref_loss, ref_sum, ref_n = np_loss(ref_logits, labels)
    scale = float(np.abs(ref_logits).max())
    e_logits = close(r64["logits"].numpy(), ref_logits, 1e-11, 1e-12 * scale, f"{tag}: float64 logits vs numpy")
    e_logits /= scale
    e_loss = abs(float(r64["loss"]) - ref_loss)
    check(e_loss < 1e-12, f"{tag}: float64 loss {float(r64['loss'])!r} vs numpy {ref_loss!r}")
    check(ref_n == n_valid, f"{tag}: numpy valid count")
    e32 = close(r32["logits"].numpy(), ref_logits, 1e-4, 2e-5 * scale, f"{tag}: float32 logits vs numpy") / scale
    check(abs(float(r32["loss"]) - ref_loss) < 2e-5 * max(1.0, ref_loss),
          f"{tag}: float32 loss {float(r32['loss'])} vs {ref_loss}")

    worst = float("nan")
    if fd:
        names = {}
        for k in params:
            canon = k if (cfg.arch != "gpt2" or k.startswith("transformer.")) else "transformer." + k
            names[canon] = k
        worst = fd_check(cfg, W_np, batch, r64, names, tag, np.random.default_rng(seed))
    print(f"  {tag:24s} loss {float(r64['loss']):.10f}  max|logit| {scale:.2g}  rel err f64 {e_logits:.1e} "
          f"f32 {e32:.1e}  |dloss| {e_loss:.0e}  worst FD rel {worst:.0e}  ({time.time() - t0:.1f}s)")
    return weights, batch, r64


def main():
    t_start = time.time()
    st.selfcheck()
    print("safetensors_io round trip: ok")

    gpt2 = {"arch": "gpt2", "vocab_size": 37, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 16}
    llama_gqa = {"arch": "llama", "vocab_size": 41, "hidden_size": 32, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 40,
                 "max_position_embeddings": 64, "rope_theta": 500.0, "norm_eps": 1e-5,
                 "tie_word_embeddings": False}
    llama_mqa = dict(llama_gqa, num_key_value_heads=1, num_hidden_layers=1)
    llama_tied = {"arch": "llama", "vocab_size": 29, "hidden_size": 24, "num_hidden_layers": 1,
                  "num_attention_heads": 3, "intermediate_size": 20, "tie_word_embeddings": True}

    with tempfile.TemporaryDirectory() as tmp:
        print("model_ref vs independent numpy float64 (+ finite-difference grads):")
        w_a, b_a, r_a = case(tmp, "gpt2_prefix_buffers", gpt2, S=9, buffers=True)
        w_b, b_b, r_b = case(tmp, "gpt2_noprefix", gpt2, S=9, prefix=False, fd=False)
        check(all(k.startswith("h.") or k.startswith(("wte", "wpe", "ln_f")) for k in w_b),
              "gpt2_noprefix: names lack transformer.")
        check(torch.equal(r_a["logits"], r_b["logits"]) and torch.equal(r_a["loss"], r_b["loss"]),
              "gpt2: prefix and no-prefix weights give identical results")
        check(torch.equal(r_a["grad.transformer.h.1.mlp.c_fc.weight"], r_b["grad.h.1.mlp.c_fc.weight"]),
              "gpt2: prefix and no-prefix gradients identical")
        case(tmp, "llama_gqa_untied", llama_gqa, B=2, S=8, seed=3, pos_offset=5)
        case(tmp, "llama_mqa_f32store", llama_mqa, B=1, S=6, seed=4, store=torch.float32)
        case(tmp, "llama_tied_mha", llama_tied, B=2, S=5, seed=5)
        # large weights: peaked attention, O(1) logits (std 0.02 leaves attention nearly uniform)
        case(tmp, "gpt2_std0.4", gpt2, S=9, seed=6, std=0.4)
        case(tmp, "llama_gqa_std0.4", llama_gqa, S=8, seed=7, std=0.4, pos_offset=2)

        # the torch model directly vs numpy at larger positions (RoPE angles) with GQA
        cfg = tm.ModelConfig(dict(llama_gqa, num_hidden_layers=1))
        W = make_case.make_weights(cfg, 11)
        bt = make_case.make_batch(cfg, 11, 1, 5, position_offset=1000)
        lt = tm.forward(cfg, W, bt["input_ids"], bt["position_ids"]).numpy()
        ln = np_llama(cfg, {k: v.numpy() for k, v in W.items()}, bt["input_ids"].numpy(),
                      bt["position_ids"].numpy())
        err = close(lt, ln, 1e-11, 1e-12 * float(np.abs(ln).max()), "llama positions ~1000: torch vs numpy")
        print(f"  {'llama_positions_1000':28s} |logits-numpy| {err:.1e}")

        print("error handling:")
        cfg_path = os.path.join(tmp, "llama_gqa_untied.json")
        wpath = os.path.join(tmp, "llama_gqa_untied.w.safetensors")
        bpath = os.path.join(tmp, "llama_gqa_untied.in.safetensors")
        out = os.path.join(tmp, "err.out.safetensors")
        weights, _ = st.load(wpath)

        def expect_error(tag, tensors=None, cfg_obj=None, needle="", batch_tensors=None):
            wp, cp, bp = wpath, cfg_path, bpath
            if tensors is not None:
                wp = os.path.join(tmp, f"{tag}.w.safetensors")
                st.save(wp, tensors)
            if cfg_obj is not None:
                cp = os.path.join(tmp, f"{tag}.json")
                write_json(cp, cfg_obj)
            if batch_tensors is not None:
                bp = os.path.join(tmp, f"{tag}.in.safetensors")
                st.save(bp, batch_tensors)
            rc, err = run_ref(["--config", cp, "--weights", wp, "--batch", bp, "--dtype", "float64",
                               "--out", out])
            lines = err.strip().splitlines()
            ok = rc == 2 and lines and lines[-1].startswith("error:") and needle in lines[-1]
            check(ok, f"error case {tag}: rc={rc} stderr={err.strip()!r}")
            print(f"  {tag:28s} rc={rc}  {lines[-1] if lines else ''}")

        missing = {k: v for k, v in weights.items() if k != "model.layers.1.mlp.up_proj.weight"}
        expect_error("missing_weight", tensors=missing, needle="model.layers.1.mlp.up_proj.weight")
        no_head = {k: v for k, v in weights.items() if k != "lm_head.weight"}
        expect_error("untied_without_lm_head", tensors=no_head, needle="lm_head.weight")
        bad = dict(weights)
        bad["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(32, 32, dtype=torch.float64)
        expect_error("shape_mismatch", tensors=bad, needle="k_proj")
        expect_error("bad_arch", cfg_obj={"model": dict(llama_gqa, arch="bert")}, needle="model.arch")
        expect_error("kv_heads_not_dividing", cfg_obj={"model": dict(llama_gqa, num_key_value_heads=3)},
                     needle="num_key_value_heads")
        bb, _ = st.load(bpath)
        expect_error("missing_labels", batch_tensors={k: v for k, v in bb.items() if k != "labels"},
                     needle="labels")
        expect_error("token_out_of_range", batch_tensors=dict(bb, input_ids=bb["input_ids"] + 1000),
                     needle="input_ids")
        rc, err = run_ref(["--config", os.path.join(tmp, "nope.json"), "--weights", wpath, "--batch", bpath,
                           "--out", out])
        check(rc == 2 and err.startswith("error:") and "nope.json" in err, f"missing config file: {rc} {err}")
        check(not os.path.exists(out), "no output written on error")

        # the CLI as a real process (OMP_NUM_THREADS honoured, exit codes)
        print("CLI as a subprocess:")
        env = dict(os.environ, OMP_NUM_THREADS="2")
        script = os.path.join(_HERE, "model_ref.py")
        outp = os.path.join(tmp, "proc.out.safetensors")
        p = subprocess.run(["/usr/bin/python3", script, "--config", cfg_path, "--weights", wpath, "--batch",
                            bpath, "--dtype", "float64", "--out", outp, "--grads"], env=env,
                           capture_output=True, text=True)
        check(p.returncode == 0, f"subprocess rc {p.returncode}: {p.stderr}")
        if p.returncode == 0:
            a, _ = st.load(outp)
            b, _ = st.load(os.path.join(tmp, "llama_gqa_untied.out64.safetensors"))
            check(list(a) == list(b) and all(torch.allclose(a[k], b[k], rtol=1e-12, atol=1e-14) for k in a),
                  "subprocess output equals in-process output")
        p = subprocess.run(["/usr/bin/python3", script, "--config", cfg_path, "--weights",
                            os.path.join(tmp, "missing_weight.w.safetensors"), "--batch", bpath, "--out", outp],
                           env=env, capture_output=True, text=True)
        check(p.returncode == 2 and p.stderr.startswith("error:"), f"subprocess error rc {p.returncode}")
        print(f"  rc=0 run ok; missing weight -> rc={p.returncode} {p.stderr.strip()}")

    print("train_ref.py:")
    selftest_train.run_all()  # counts into the same tally

    dt = time.time() - t_start
    print(f"{CHECKS[0]} checks, {len(FAILURES)} failures, {dt:.1f}s")
    # The time is printed, not asserted: on a loaded 2-core CI machine a wall-clock budget fails
    # tests that are right (performance is measured by the benchmarks, not by tests).
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
