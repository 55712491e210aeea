#!/usr/bin/env python3
"""autosp-train's DPO objective (train.objective "dpo", issue 44) against TRL's formulas in float64
(tests/ref/dpo_ref.py trl_dpo) on transformers models (4.44, PEFT 0.12): a tiny chat tokenizer and
Llama (tests/ref/chat_fixture.py) and a Qwen2 of its vocabulary, preference pairs through
scripts/prepare_data.py --preference, then one step of autosp-train with model.from and
runtime.dtype float64 on every window at once. Its step-1 loss, TRL's six metrics (rewards/chosen,
rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen, logps/rejected) and its
first-step gradients (--dump-grads) equal the reference's, computed from the packed windows'
per-sequence log-probabilities (dpo_ref.packed_sequence_logps, checked equal to TRL's per-sequence
forward by ref.dpo_packing) through autograd:
  - full fine-tuning (the reference: the starting weights; at step 1 policy = reference, so z = 0),
    sigmoid, at P = 1, 2 (Ulysses), 2 (ring), 4 (dp 2 × sp 2; also ZeRO-1, 2 and 3) and with 2
    micro-batches, and with dpo.precompute_ref at P = 2 and at dp 2 × sp 2 with 2 micro-batches;
  - Llama with a PEFT adapter (lora.from; random A and B, so the policy differs from the reference,
    the base with the adapters off): sigmoid with label smoothing, IPO, and rpo_alpha, at P = 1 and 2,
    and at P = 2 with dpo.precompute_ref (the three losses read one file of the base's sums beside the
    pairs: the adapters are not in its key), and an adapter with modules_to_save (a norm moved off its
    base, which the reference must not read) at P = 2; sigmoid with label smoothing also in bfloat16 at P = 2,
    within bf16's error (2e-3 of the loss and metrics, 2e-2 of the largest gradient);
  - Qwen2, sigmoid, at P = 1;
  - runtime.tiled_loss (the sums through the tiled head, no [B, S, V] logits): full fine-tuning at
    P = 1, 2 (ring) and dp 2 × sp 2, Qwen2 at P = 2, every LoRA loss at P = 2 (a frozen head: no dw)
    and bfloat16 LoRA at P = 2;
  - validation (train.eval_every) with the adapter and lr 0: the DPO loss and TRL's eval_ metrics on a
    validation split, at P = 1, 2 (Ulysses), 2 (ring), dp 2 × sp 2 and with dpo.precompute_ref.
Tolerances as tests/ref/hf_lora.py: transformers 4.44 takes RoPE's cos and sin in float32.

  .venv-hf/bin/python tests/ref/hf_dpo.py BIN_DIR SOURCE_DIR    (exit 77: transformers or PEFT missing)
"""
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dpo_ref import dpo_rewards, float64_softmax, packed_sequence_logps, read_split, trl_dpo  # noqa: E402  (77 without PEFT)
from peft import LoraConfig, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

S = 64
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
           "logps/rejected")
LOSS_TOL, GRAD_REL = 1e-6, 1e-5
ACCURACY_RANGE = "rewards/accuracies range"  # reference()'s (lowest, highest) of ties tipped either way
BF16_TOL, BF16_REL = 2e-3, 2e-2  # one bf16 rounding per op result against float64


def rows():
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()
    u = lambda c: {"role": "user", "content": c}
    a = lambda c: {"role": "assistant", "content": c}
    out = []
    for i in range(9):  # 8 windows of 64 tokens: the dp × sp case splits them evenly
        w, v = words[i], words[i + 1]
        if i % 2:
            out.append({"prompt": [u(f"say {w} twice please")], "chosen": [a(f"{w} {w}")], "rejected": [a(v)]})
        else:
            out.append({"prompt": f"what is the next word after {w}?", "chosen": f" {v}", "rejected": f" {w} {v} {w}"})
    return out


def reference(model, data, loss_kw, lora=False):
    """TRL's loss, metrics and gradients ({autosp name: grad}) on the packed windows."""
    with torch.no_grad():
        if lora:
            with model.disable_adapter():
                ref = packed_sequence_logps(model, data, S)
        else:
            ref = packed_sequence_logps(model, data, S)
    ref = {k: (v[0].detach(), v[1]) for k, v in ref.items()}
    policy = packed_sequence_logps(model, data, S)
    loss, metrics = trl_dpo(policy, ref, beta=0.1, **loss_kw)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named])
    # --dump-grads' names: the checkpoint's (with LoRA, the adapter's keys: PEFT's names less .default)
    key = lambda n: n.replace(".modules_to_save.default", "").replace(".default", "")
    metrics = {k: float(v) for k, v in metrics.items()}
    metrics[ACCURACY_RANGE] = accuracy_range(policy, ref, loss_kw.get("loss_type", "sigmoid"))
    return float(loss), metrics, {key(n): g for (n, _), g in zip(named, grads)}


def accuracy_range(policy, ref, loss_type, tie=1e-9):
    """The lowest and highest rewards/accuracies (the share of pairs whose chosen reward beats the
    rejected one) that rounding can give: a pair whose margin is within `tie` of 0 may count either
    way. Where the policy is the reference (step 1 without LoRA) every margin is 0 in exact
    arithmetic, so the count is the rounding's, which the batch layout, the kernels' summation order
    and the CPU (AMX or not) tip either way; elsewhere the range is one value."""
    with torch.no_grad():
        chosen, rejected = dpo_rewards(policy, ref, 0.1, loss_type)
        margins = (chosen - rejected).tolist()
    return (sum(m > tie for m in margins) / len(margins), sum(m > -tie for m in margins) / len(margins))


def run(bin_dir, work, config, name, ranks=1):
    cfg_path, metrics, grads = (os.path.join(work, name + e) for e in (".json", ".jsonl", ".grads.safetensors"))
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    cmd = [os.path.join(bin_dir, "autosp-train"), "--config", cfg_path, "--metrics", metrics, "--quiet",
           "--dump-grads", grads] + (["--thread-ranks", str(ranks)] if ranks > 1 else [])
    p = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    with open(metrics) as f:
        return json.loads(f.readline()), load_file(grads)


def compare(what, rec, grads, want_loss, want_metrics, want_grads, tol=LOSS_TOL, rel=GRAD_REL):
    """A line, and whether autosp's step 1 equals the reference (metrics within tol · (1 + |value|))."""
    def off(k):  # rewards/accuracies: anywhere in the range rounding can give (accuracy_range)
        if k == "rewards/accuracies" and ACCURACY_RANGE in want_metrics:
            lo, hi = want_metrics[ACCURACY_RANGE]
            return max(0.0, lo - rec[k], rec[k] - hi) / (1 + abs(want_metrics[k]))
        return abs(rec[k] - want_metrics[k]) / (1 + abs(want_metrics[k]))
    worst_m = max(off(k) for k in METRICS)
    scale = max(float(g.abs().max()) for g in want_grads.values())
    same_names = set(grads) == set(want_grads)
    worst_g = max(float((grads[k].double() - g).abs().max()) for k, g in want_grads.items()) if same_names else 1e300
    ok = abs(rec["loss"] - want_loss) <= tol and worst_m <= tol and worst_g <= rel * scale
    print(f"{'ok  ' if ok else 'FAIL'} {what}: loss {rec['loss']:.10f} (TRL {want_loss:.10f}), worst metric |diff| "
          f"{worst_m:.1e}, gradients {len(grads)} worst |diff| {worst_g:.1e} of {scale:.1e}"
          + ("" if same_names else f"; names differ: {sorted(set(grads) ^ set(want_grads))[:4]}"), flush=True)
    return ok


def check_validation(bin_dir, src, work, fx, adapter, lora):
    data = os.path.join(work, "pairs_val")
    subprocess.run([sys.executable, os.path.join(src, "scripts/prepare_data.py"), "--preference", "--tokenizer", fx,
                    "--seq-len", str(S), "--val-fraction", "0.45", "--out", data, os.path.join(work, "pairs.jsonl")],
                   check=True, capture_output=True)
    info = json.load(open(os.path.join(data, "data.json")))
    windows = (len(read_split(data, "val")[0]) - 1) // S
    with torch.no_grad():
        with lora.disable_adapter():
            ref = packed_sequence_logps(lora, data, S, "val")
        loss, metrics = trl_dpo(packed_sequence_logps(lora, data, S, "val"), ref, beta=0.1)
    want = {"val_loss": float(loss), **{"eval_" + k: float(v) for k, v in metrics.items()}}

    def config(batch, sp=1, ring=1, **dpo):
        d = info["data"]
        return {"model": {"from": fx}, "lora": {"from": adapter},
                "data": {"source": "tokens", "path": d["path"], "loss_mask_path": d["loss_mask_path"],
                         "pairs_path": info["pairs_path"], "val_path": d["val_path"],
                         "val_loss_mask_path": d["val_loss_mask_path"], "val_pairs_path": info["val_pairs_path"],
                         "seq_len": S, "batch_size": batch},
                "train": {"steps": 1, "log_every": 1, "objective": "dpo", "lr": 0, "min_lr": 0, "eval_every": 1,
                          "eval_batches": 1},
                "dpo": dict({"beta": 0.1}, **dpo),
                "sequence_parallel": {"autosp_size": sp, "ring_size": ring},
                "runtime": {"dtype": "float64", "threads": 1}}

    cases = [("P=1", config(windows), 1), ("P=2 Ulysses", config(windows, sp=2), 2),
             ("P=2 ring", config(windows, sp=2, ring=2), 2),
             ("P=2 precompute_ref", config(windows, sp=2, precompute_ref=True), 2),
             ("P=2 precompute_ref, read back", config(windows, sp=2, precompute_ref=True), 2)]
    if windows % 2 == 0:
        cases.append(("dp 2 x sp 2", config(windows // 2, sp=2), 4))
    ok = True
    for what, cfg, ranks in cases:
        rec, _ = run(bin_dir, work, cfg, "val_" + what.replace(" ", "_").replace(",", "").replace("=", ""), ranks)
        worst = max(abs(rec[k] - v) / (1 + abs(v)) for k, v in want.items())
        good = worst <= LOSS_TOL and rec["val_accuracy"] is None
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} llama + LoRA validation {what}: val_loss {rec['val_loss']:.10f} "
              f"(TRL {want['val_loss']:.10f}), worst eval_ metric |diff| {worst:.1e} over {windows} windows", flush=True)
    ok &= os.path.exists(os.path.join(data, "ref_logps_val.safetensors"))
    return ok


def main():
    bin_dir, src = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    float64_softmax()
    py = sys.executable
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        fx, data, qwen_dir = (os.path.join(work, n) for n in ("fx", "pairs", "qwen2"))
        subprocess.run([py, os.path.join(HERE, "chat_fixture.py"), fx, "--model"], check=True)
        with open(os.path.join(work, "pairs.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows())
        subprocess.run([py, os.path.join(src, "scripts/prepare_data.py"), "--preference", "--tokenizer", fx,
                        "--seq-len", str(S), "--val-fraction", "0", "--out", data, os.path.join(work, "pairs.jsonl")],
                       check=True, capture_output=True)
        info = json.load(open(os.path.join(data, "data.json")))
        windows = (len(read_split(data)[0]) - 1) // S
        assert windows % 2 == 0, f"{windows} windows: the dp × sp case needs an even number"
        vocab = info["model"]["vocab_size"]
        llama = AutoModelForCausalLM.from_pretrained(fx, torch_dtype=torch.float64, attn_implementation="eager")
        qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                            eos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
                                            attn_implementation="eager")).double()
        qwen.save_pretrained(qwen_dir, safe_serialization=True)
        qwen = AutoModelForCausalLM.from_pretrained(qwen_dir, torch_dtype=torch.float64, attn_implementation="eager")

        def config(model_dir, batch, k=1, sp=1, ring=1, zero=0, dtype="float64", tiled=False, **dpo):
            return {"model": {"from": model_dir},
                    "data": {"source": "tokens", "path": info["data"]["path"],
                             "loss_mask_path": info["data"]["loss_mask_path"], "pairs_path": info["pairs_path"],
                             "seq_len": S, "batch_size": batch},
                    "train": {"steps": 1, "log_every": 1, "objective": "dpo", "gradient_accumulation_steps": k},
                    "dpo": dict({"beta": 0.1}, **dpo),
                    "sequence_parallel": {"autosp_size": sp, "ring_size": ring},
                    "zero_optimization": {"stage": zero},
                    "runtime": {"dtype": dtype, "threads": 1, "tiled_loss": tiled}}

        want = reference(llama, data, {})
        for what, cfg, ranks in (("llama P=1", config(fx, windows), 1),
                                 ("llama P=2 Ulysses", config(fx, windows, sp=2), 2),
                                 ("llama P=2 ring", config(fx, windows, sp=2, ring=2), 2),
                                 ("llama dp 2 x sp 2", config(fx, windows // 2, sp=2), 4),
                                 ("llama dp 2 x sp 2, ZeRO-1", config(fx, windows // 2, sp=2, zero=1), 4),
                                 ("llama dp 2 x sp 2, ZeRO-2", config(fx, windows // 2, sp=2, zero=2), 4),
                                 ("llama dp 2 x sp 2, ZeRO-3", config(fx, windows // 2, sp=2, zero=3), 4),
                                 ("llama 2 micro-batches", config(fx, windows // 2, k=2), 1),
                                 ("llama P=1 tiled loss", config(fx, windows, tiled=True), 1),
                                 ("llama P=2 ring tiled loss", config(fx, windows, sp=2, ring=2, tiled=True), 2),
                                 ("llama dp 2 x sp 2 tiled loss", config(fx, windows // 2, sp=2, tiled=True), 4),
                                 ("llama P=2 precompute_ref", config(fx, windows, sp=2, precompute_ref=True), 2),
                                 ("llama dp 2 x sp 2 precompute_ref", config(fx, 2, k=2, sp=2, precompute_ref=True), 4)):
            if what.startswith("llama dp 2 x sp 2 precompute_ref"):
                # Its own sums, not the file the P = 2 case stored (decision 167): at step 1 the policy
                # is the reference, so every margin is 0 up to rounding, and rewards/accuracies
                # (margins > 0) would count the ties that another batch layout's rounding tips.
                os.remove(os.path.join(data, "ref_logps_train.safetensors"))
            failed += not compare(what, *run(bin_dir, work, cfg, what.replace(" ", "_").replace(",", ""), ranks), *want)
        want = reference(qwen, data, {})
        failed += not compare("qwen2 P=1", *run(bin_dir, work, config(qwen_dir, windows), "qwen2"), *want)
        failed += not compare("qwen2 P=2 tiled loss", *run(bin_dir, work, config(qwen_dir, windows, sp=2, tiled=True),
                                                           "qwen2_tiled", 2), *want)

        adapter = os.path.join(work, "adapter")
        torch.manual_seed(1)
        lora = get_peft_model(llama, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))
        lora.save_pretrained(adapter)
        for kind, kw, keys in (("sigmoid, label smoothing 0.2", {"label_smoothing": 0.2}, {"label_smoothing": 0.2}),
                               ("ipo", {"loss_type": "ipo"}, {"loss_type": "ipo"}),
                               ("rpo_alpha 0.5", {"rpo_alpha": 0.5}, {"rpo_alpha": 0.5})):
            want = reference(lora, data, kw, lora=True)
            for ranks, pre, tiled in ((1, False, False), (2, False, False), (2, True, False), (2, False, True)):
                cfg = config(fx, windows, sp=ranks, precompute_ref=pre, tiled=tiled, **keys)
                cfg["lora"] = {"from": adapter}
                what = f"llama + LoRA {kind} P={ranks}" + (" precompute_ref" if pre else "") + (" tiled loss" if tiled else "")
                name = f"lora_{kind.split()[0]}_{ranks}_{pre}_{tiled}"
                failed += not compare(what, *run(bin_dir, work, cfg, name, ranks), *want)
            if kind.startswith("sigmoid"):  # bf16 (f32 masters, bf16 compute): close to the float64 reference
                cfg = config(fx, windows, sp=2, dtype="bfloat16", **keys)
                cfg["lora"] = {"from": adapter}
                failed += not compare(f"llama + LoRA {kind} P=2 bfloat16", *run(bin_dir, work, cfg, "lora_bf16", 2),
                                      *want, tol=BF16_TOL, rel=BF16_REL)
                cfg["runtime"]["tiled_loss"] = True
                failed += not compare(f"llama + LoRA {kind} P=2 bfloat16 tiled loss",
                                      *run(bin_dir, work, cfg, "lora_bf16_tiled", 2), *want, tol=BF16_TOL, rel=BF16_REL)
        # Validation (train.eval_every) on the validation split of the same rows: lr 0, so the policy
        # that validates is the adapter's; the DPO loss and TRL's eval_ metrics of one batch holding
        # every validation window, at P = 1, 2 (Ulysses), 2 (ring), dp 2 × sp 2 (one batch across
        # both dp ranks) and with dpo.precompute_ref at P = 2 twice (the second reads the file).
        failed += not check_validation(bin_dir, src, work, fx, adapter, lora)
        # modules_to_save (a norm, moved off its base values): PEFT's disable_adapter() reads the base's
        # module, so the reference must too.
        llama = AutoModelForCausalLM.from_pretrained(fx, torch_dtype=torch.float64, attn_implementation="eager")
        saved_adapter = os.path.join(work, "adapter_saved")
        torch.manual_seed(2)
        lora = get_peft_model(llama, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                                modules_to_save=["norm"], init_lora_weights=False))
        with torch.no_grad():
            for name, p in lora.named_parameters():
                if "modules_to_save" in name:
                    p.add_(0.05 * torch.randn_like(p))
        lora.save_pretrained(saved_adapter)
        want = reference(lora, data, {}, lora=True)
        want = (want[0], want[1], {k.replace(".modules_to_save", ""): g for k, g in want[2].items()})
        cfg = config(fx, windows, sp=2)
        cfg["lora"] = {"from": saved_adapter}
        failed += not compare("llama + LoRA, modules_to_save norm P=2", *run(bin_dir, work, cfg, "lora_saved", 2), *want)
    print("FAILED" if failed else "DPO equals TRL's formulas (loss, metrics, gradients)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
