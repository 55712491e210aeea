#!/usr/bin/env python3
"""The load-balancing loss (model.output_router_logits) against transformers 4.44 in float64.

Run with the venv of scripts/hf-venv.sh:  .venv-hf/bin/python tests/ref/hf_moe_aux.py BIN_DIR
Exits 77 (skipped) when transformers is not importable.

For hf_moe.py's tiny Mixtral and Qwen2-MoE (one dense layer by mlp_only_layers) with
output_router_logits and router_aux_loss_coef 0.05, autosp-train's first step (--thread-ranks,
"model": {"from": DIR}, float64) is compared with transformers' modeling code on the same tokens:
the loss (the LM loss plus the coefficient times load_balancing_loss_func over the MoE layers'
router logits, as MixtralForCausalLM.forward adds it), moe/aux_loss (the loss before the
coefficient), moe/expert_load (the worst layer's max / mean tokens per expert, from the router
logits' top-k) and every first-step gradient (--dump-grads, against torch autograd). A "batch" of
the load-balancing loss is one micro-batch of one data-parallel rank (docs/decisions.md): the
reference computes it per (rank, micro-batch) and averages, and the LM loss over all targets.
Runs: P = 1; Ulysses P = 2 and 4; ring attention (P = 2); dp 2 x sp 2; ZeRO-3 with activation
checkpointing; 2 micro-batches of gradient accumulation at P = 2; loss masks (data.loss_mask_path,
which the load-balancing loss ignores as transformers' does: it reads only the attention mask) at
P = 1 and 4; router_aux_loss_coef 0 (the LM loss alone, the aux loss still logged); and
packed documents (data.document_mask) at P = 1, 2, 4 against each document run on its own, the
router logits of all of them in the one loss (what transformers computes on packed rows given no
attention mask); and runtime.dtype bfloat16 at P = 1 and 2 against transformers' model in bfloat16
(loss and aux loss within bf16's rounding, BF16_*_TOL).
Tolerances as hf_moe.py's: transformers computes RoPE's cos and sin in float32 even for a float64
model, which moves the loss by ~1e-7 and, through the hidden states the routers read, the aux loss
by ~1e-9 (measured: loss within 1e-7, aux within 5e-9, gradients within 1.4e-6 relative); the
expert load is counted exactly.
"""
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_roundtrip import SEQ, load_hf, write_tokens  # noqa: E402

try:
    from hf_moe import VOCAB, tiny_models
    from hf_sft import run
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
except ImportError as e:
    print(f"skipped: transformers is not importable ({e}); run scripts/hf-venv.sh", file=sys.stderr)
    sys.exit(77)

COEF = 0.05
# bf16 against transformers in bf16, relative: measured (2026-12-05) aux 4.7e-4 (Mixtral) and 2.6e-3
# (Qwen2-MoE), loss 8.4e-3 and 3.0e-3; transformers' bf16 loss is the farther from float64 (its
# logits and cross-entropy in bf16: Mixtral 5.2277 and ours 5.1840 against 5.1868 in float64).
BF16_AUX_TOL, BF16_LOSS_TOL = 1e-2, 2.5e-2
EOS = 3  # packed documents' separator
ROWS = 4  # sequences per data-parallel rank and step


def write_shard(path, tokens):
    """tokens as an llm.c token shard (hf_roundtrip.write_tokens' format)."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())


def windows(tokens, mask, dp, rank, rows):
    """x [rows, SEQ + 1] and HF's labels [rows, SEQ] of data-parallel rank `rank` at step 0 (the llm.c
    order of hf_roundtrip.batch_tokens); a label is -100 where the mask removes its token."""
    x, labels = [], []
    for b in range(rows):
        start = (rank * rows + b) * SEQ
        idx = [(start + i) % len(tokens) for i in range(SEQ + 1)]
        x.append([tokens[i] for i in idx])
        labels.append([tokens[i] if mask[i] else -100 for i in idx[1:]])
    return torch.tensor(x, dtype=torch.int64), torch.tensor(labels, dtype=torch.int64)


def reference(model, tokens, mask, dp, k, coef):
    """transformers' loss, aux loss, expert load and gradients for a step of dp ranks x k micro-batches."""
    cfg = model.config
    E = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    model.zero_grad()
    ce, targets, auxes, counts = 0.0, 0, [], None
    for rank in range(dp):
        x, labels = windows(tokens, mask, dp, rank, ROWS)
        for i in range(k):
            rows = slice(i * ROWS // k, (i + 1) * ROWS // k)
            out = model.base_model(input_ids=x[rows, :-1], output_router_logits=True)
            logits = model.get_output_embeddings()(out[0])
            ce = ce + torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                        labels[rows].reshape(-1), ignore_index=-100, reduction="sum")
            targets += int((labels[rows] != -100).sum())
            auxes.append(load_balancing_loss_func(out.router_logits, E, cfg.num_experts_per_tok, None))
            layer_counts = torch.stack([torch.nn.functional.one_hot(
                torch.topk(torch.softmax(r, -1), cfg.num_experts_per_tok, -1)[1], E).sum((0, 1))
                for r in out.router_logits]).double()
            counts = layer_counts if counts is None else counts + layer_counts
    aux = sum(auxes) / len(auxes)
    loss = ce / targets + coef * aux
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    load = (counts.max(1).values / counts.mean(1)).max().item()
    return loss.item(), aux.item(), load, grads


def reference_documents(model, tokens, eos, coef):
    """The same for packed documents (data.document_mask, one data-parallel rank, one micro-batch):
    each document of each window (ending with its EOS, whose target is ignored) through the model on
    its own, as transformers sees packed sequences without an attention mask; the load-balancing
    loss over every document's router logits, concatenated per layer."""
    cfg = model.config
    E = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    model.zero_grad()
    x, labels = windows(tokens, np.ones(len(tokens), dtype=np.uint8), 1, 0, ROWS)
    ce, targets, layers = 0.0, 0, None
    for r in range(ROWS):
        ids, lab = x[r, :-1].clone(), labels[r].clone()
        lab[ids == eos] = -100
        ends = [i + 1 for i in range(SEQ) if ids[i] == eos and i + 1 < SEQ] + [SEQ]
        start = 0
        for end in ends:
            out = model.base_model(input_ids=ids[None, start:end], output_router_logits=True)
            logits = model.get_output_embeddings()(out[0])[0]
            ce = ce + torch.nn.functional.cross_entropy(logits, lab[start:end], ignore_index=-100, reduction="sum")
            targets += int((lab[start:end] != -100).sum())
            layers = [[g] for g in out.router_logits] if layers is None else \
                [have + [g] for have, g in zip(layers, out.router_logits)]
            start = end
    aux = load_balancing_loss_func(tuple(torch.cat(g, 0) for g in layers), E, cfg.num_experts_per_tok, None)
    loss = ce / targets + coef * aux
    loss.backward()
    return loss.item(), aux.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def compare(what, rec, grads, want_loss, want_aux, want_grads, want_load=None):
    """Prints our first step against the reference; returns the line when it is off, else None."""
    worst = max(float((grads[n].double() - g).abs().max() / g.abs().max().clamp_min(1e-30))
                for n, g in want_grads.items())
    line = (f"{what}: loss {rec['loss']:.12f} (|diff| {abs(rec['loss'] - want_loss):.1e}), "
            f"aux {rec['moe/aux_loss']:.12f} (|diff| {abs(rec['moe/aux_loss'] - want_aux):.1e}), "
            f"load {rec['moe/expert_load']:.6f}" + (f" vs {want_load:.6f}" if want_load is not None else "") +
            f", worst gradient rel. error {worst:.1e}")
    print(line)
    ok = (abs(rec["loss"] - want_loss) < 1e-6 and abs(rec["moe/aux_loss"] - want_aux) < 1e-8 and worst < 1e-5
          and set(grads) == set(want_grads) and (want_load is None or abs(rec["moe/expert_load"] - want_load) < 1e-12))
    return None if ok else line


# (name, P, ring, dp, micro-batches, ZeRO stage, loss mask, coefficient)
RUNS = [("p1", 1, 1, 1, 1, 0, False, COEF), ("p2", 2, 1, 1, 1, 0, False, COEF), ("p4", 4, 1, 1, 1, 0, False, COEF),
        ("ring2", 2, 2, 1, 1, 0, False, COEF), ("dp2sp2", 2, 1, 2, 1, 0, False, COEF),
        ("zero3", 2, 1, 1, 1, 3, False, COEF), ("accum2", 2, 1, 1, 2, 0, False, COEF),
        ("mask-p1", 1, 1, 1, 1, 0, True, COEF), ("mask-p4", 4, 1, 1, 1, 0, True, COEF),
        ("coef0", 2, 1, 1, 1, 0, False, 0.0)]


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else "build/bin"
    work = tempfile.mkdtemp(prefix="autosp-moe-aux-")
    failures = []
    try:
        tokens = write_tokens(os.path.join(work, "tokens.bin"), 4096, VOCAB)
        mask = (np.random.default_rng(3).random(len(tokens)) < 0.6).astype(np.uint8)  # 40% of targets removed
        np.save(os.path.join(work, "mask.npy"), mask)
        everything = np.ones_like(mask)
        for family, model in tiny_models().items():
            model.config.output_router_logits = True
            src = os.path.join(work, f"{family}-hf")
            model.save_pretrained(src, safe_serialization=True)
            ref = load_hf(src)
            # The reference's aux loss is the model's own (its forward returns it with output_router_logits).
            x, _ = windows(tokens, everything, 1, 0, ROWS)
            with torch.no_grad():
                own = ref(input_ids=x[:, :-1]).aux_loss.item()
            assert abs(own - reference(ref, tokens, everything, 1, 1, COEF)[1]) < 1e-12, "reference aux loss"
            for name, P, ring, dp, k, zero, masked, coef in RUNS:
                want_loss, want_aux, want_load, want_grads = reference(ref, tokens, mask if masked else everything,
                                                                       dp, k, coef)
                data = {"source": "tokens", "path": os.path.join(work, "tokens.bin"), "seq_len": SEQ,
                        "batch_size": ROWS // k}
                if masked:
                    data["loss_mask_path"] = os.path.join(work, "mask.npy")
                config = {"model": {"from": src, "router_aux_loss_coef": coef}, "data": data,
                          "train": {"steps": 1, "lr": 1e-3, "warmup_steps": 0, "log_every": 1,
                                    "gradient_accumulation_steps": k},
                          "runtime": {"dtype": "float64", "threads": 1, "activation_checkpointing": zero == 3},
                          "sequence_parallel": {"autosp_size": P, "ring_size": ring},
                          "zero_optimization": {"stage": zero}}
                rec, grads = run(bin_dir, work, config, f"{family}-{name}", ranks=P * dp)
                failures.append(compare(f"{family} {name}", rec, grads, want_loss, want_aux, want_grads, want_load))
            # bf16: transformers' model cast to bfloat16 (its load-balancing softmax in bf16, the
            # router's top-k softmax in float32) against runtime.dtype bfloat16 at P = 1 and 2: the
            # loss and the aux loss within bf16's rounding (BF16_*_TOL, relative, 3x what was measured).
            ref16 = load_hf(src).to(torch.bfloat16)
            want_loss, want_aux, _, _ = reference(ref16, tokens, everything, 1, 1, COEF)
            for P in (1, 2):
                config = {"model": {"from": src, "router_aux_loss_coef": COEF},
                          "data": {"source": "tokens", "path": os.path.join(work, "tokens.bin"), "seq_len": SEQ,
                                   "batch_size": ROWS},
                          "train": {"steps": 1, "lr": 1e-3, "warmup_steps": 0, "log_every": 1},
                          "runtime": {"dtype": "bfloat16", "threads": 1},
                          "sequence_parallel": {"autosp_size": P}}
                rec, _ = run(bin_dir, work, config, f"{family}-bf16-p{P}", ranks=P)
                dl = abs(rec["loss"] - want_loss) / want_loss
                da = abs(rec["moe/aux_loss"] - want_aux) / want_aux
                line = (f"{family} bf16 P={P}: loss {rec['loss']:.6f} vs transformers bf16 {want_loss:.6f} "
                        f"(rel {dl:.1e}), aux {rec['moe/aux_loss']:.6f} vs {want_aux:.6f} (rel {da:.1e})")
                print(line)
                failures.append(None if dl <= BF16_LOSS_TOL and da <= BF16_AUX_TOL else line)
            # Packed documents (an EOS every ~4 tokens) at P = 1, 2 and 4.
            docs = tokens.copy()
            docs[np.random.default_rng(5).random(len(docs)) < 0.25] = EOS
            write_shard(os.path.join(work, "docs.bin"), docs)
            want_loss, want_aux, want_grads = reference_documents(ref, docs, EOS, COEF)
            for P in (1, 2, 4):
                config = {"model": {"from": src, "router_aux_loss_coef": COEF},
                          "data": {"source": "tokens", "path": os.path.join(work, "docs.bin"), "seq_len": SEQ,
                                   "batch_size": ROWS, "eos_token_id": EOS, "document_mask": True},
                          "train": {"steps": 1, "lr": 1e-3, "warmup_steps": 0, "log_every": 1},
                          "runtime": {"dtype": "float64", "threads": 1},
                          "sequence_parallel": {"autosp_size": P}}
                rec, grads = run(bin_dir, work, config, f"{family}-docs-p{P}", ranks=P)
                failures.append(compare(f"{family} documents P={P}", rec, grads, want_loss, want_aux, want_grads))
        failures = [f for f in failures if f]
        if failures:
            print("FAILED:\n  " + "\n  ".join(failures))
            return 1
        print("hf moe aux: ok")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
