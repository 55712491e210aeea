#!/usr/bin/env python3
"""The float64 reference for DPO (issue 44): TRL's DPOTrainer formulas written out in PyTorch, and
the per-sequence log-probabilities they start from, computed two ways on a transformers model:

  trl_sequence_logps   TRL's way: each sequence of a pair run on its own (prompt + completion),
                       the log-probabilities of its completion tokens (mask 1) summed;
  packed_sequence_logps  autosp's way: the windows scripts/prepare_data.py --preference writes, run
                       whole with attention kept inside each document (a block-diagonal causal mask,
                       positions restarting per document, as data.document_mask does), each target's
                       log-probability summed into its sequence by the pair ids beside the shard
                       (pairs_<split>_NNNNNN.npy: +(k + 1) chosen, -(k + 1) rejected).
  trl_dpo              TRL's loss for loss_type "sigmoid" (with label_smoothing, conservative DPO) and
                       "ipo" (on length-averaged log-probabilities, as TRL averages them for IPO), plus
                       rpo_alpha times the NLL of the chosen completions; the chosen and rejected
                       rewards beta * (policy - reference) and the metrics TRL logs.

Run as a test (ctest ref.dpo_packing) it makes a tiny chat tokenizer and Llama and Qwen2 models
(tests/ref/chat_fixture.py, transformers, seeded), prepares preference pairs with
prepare_data.py --preference, and checks that the packed log-probabilities equal TRL's per-sequence
ones (so the shards' tokens, masks, pair ids and document boundaries carry exactly what DPO needs),
also for a LoRA policy (PEFT) whose reference is the same model with the adapters disabled, and that
the DPO loss and rewards from either agree. The autosp-train DPO objective (not built yet) is to be
checked against trl_dpo on packed_sequence_logps' inputs.

  .venv-hf/bin/python tests/ref/dpo_ref.py SOURCE_DIR     (exit 77: transformers or PEFT missing)
"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

try:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen2ForCausalLM
    from peft import LoraConfig, get_peft_model
except ImportError as e:
    print(f"skipped: transformers or PEFT is not importable ({e}); run scripts/hf-venv.sh", file=sys.stderr)
    sys.exit(77)


def float64_softmax():
    """transformers 4.44's eager attention takes its softmax in float32 even for a float64 model
    (softmax(..., dtype=torch.float32)), which puts 1e-8 of noise into a float64 reference and
    differs with the sequence's length (vector and scalar paths). Kept in float64 here."""
    plain = torch.nn.functional.softmax

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        return plain(x, dim=dim, dtype=None if dtype == torch.float32 and x.dtype == torch.float64 else dtype)
    torch.nn.functional.softmax = softmax


def read_split(d, split="train"):
    """The token stream, loss mask and pair ids of a prepared split, concatenated over its shards."""
    ids, mask, pairs = [], [], []
    for p in sorted(glob.glob(os.path.join(d, f"{split}_*.bin"))):
        raw = open(p, "rb").read()
        magic, _, n = struct.unpack("<3i", raw[:12])
        ids += list(np.frombuffer(raw[1024:], dtype="<u2" if magic == 20240520 else "<u4", count=n))
        mask += np.load(p[:-4] + ".npy").tolist()
        pairs += np.load(os.path.join(d, "pairs_" + os.path.basename(p)[:-4] + ".npy")).tolist()
    return [int(t) for t in ids], mask, pairs


def token_logps(model, ids, position_ids=None, attention_mask=None):
    """log p(ids[t + 1] | ids[..t]) for t < len - 1, in float64."""
    x = torch.tensor([ids])
    kw = {}
    if position_ids is not None:
        kw["position_ids"] = torch.tensor([position_ids])
    if attention_mask is not None:
        kw["attention_mask"] = attention_mask
    logits = model(input_ids=x, **kw).logits[0, :-1].double()
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None]).squeeze(-1)


def documents(row):
    """[(start, end)] of each sequence (a run of one nonzero pair id) in a window's pair ids."""
    out, t = [], 0
    while t < len(row):
        if row[t] == 0:
            t += 1
            continue
        a = t
        while t < len(row) and row[t] == row[a]:
            t += 1
        out.append((a, t))
    return out


def packed_sequence_logps(model, d, S, split="train"):
    """{pair id: (summed completion log-probability, completion tokens)} from the windows of S tokens:
    each window run whole, attention and positions per document, targets summed by pair id."""
    ids, mask, pairs = read_split(d, split)
    out = {}
    for w in range((len(ids) - 1) // S):
        win, wpairs = ids[w * S:w * S + S], pairs[w * S:w * S + S]
        allowed = torch.eye(S, dtype=torch.bool)  # a token outside every sequence (padding) sees itself
        pos = [0] * S
        for a, b in documents(wpairs):
            allowed[a:b, a:b] = torch.tril(torch.ones(b - a, b - a, dtype=torch.bool))
            pos[a:b] = range(b - a)
        additive = torch.zeros(1, 1, S, S, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
        lp = token_logps(model, win, pos, additive)
        for t in range(S - 1):  # target t predicts token t + 1: its mask and pair id are token t + 1's
            k = wpairs[t + 1]
            if k and mask[w * S + t + 1]:
                s, n = out.get(k, (0.0, 0))
                out[k] = (s + lp[t], n + 1)
    return out


def trl_sequence_logps(model, seqs):
    """{pair id: (summed completion log-probability, completion tokens)}, each sequence on its own."""
    out = {}
    for k, (ids, mask) in seqs.items():
        lp = token_logps(model, ids)
        m = torch.tensor(mask[1:], dtype=torch.float64)
        out[k] = ((lp * m).sum(), int(m.sum()))
    return out


def sequences(d, split="train"):
    """{pair id: (ids, mask)} of each sequence as the shards hold it (contiguous tokens of one id)."""
    ids, mask, pairs = read_split(d, split)
    out = {}
    for a, b in documents(pairs):
        out[pairs[a]] = (ids[a:b], mask[a:b])
    return out


def pair_logps(table, sign, average):
    """Each pair's chosen (sign 1) or rejected (-1) log-probability from {pair id: (sum, tokens)},
    in pair order; `average`: over the completion's tokens (TRL's IPO)."""
    keys = sorted(k for k in table if k > 0)
    return torch.stack([table[sign * k][0] / (table[sign * k][1] if average else 1) for k in keys])


def dpo_rewards(policy, reference, beta=0.1, loss_type="sigmoid"):
    """TRL's chosen and rejected rewards per pair: beta · (policy − reference) log-probabilities."""
    avg = loss_type == "ipo"  # TRL averages the log-probabilities over the completion for IPO
    return (beta * (pair_logps(policy, 1, avg) - pair_logps(reference, 1, avg)),
            beta * (pair_logps(policy, -1, avg) - pair_logps(reference, -1, avg)))


def trl_dpo(policy, reference, beta=0.1, loss_type="sigmoid", label_smoothing=0.0, rpo_alpha=None):
    """TRL's DPOTrainer.dpo_loss (+ rpo_alpha · NLL of the chosen completions) over the pairs of
    `policy` and `reference` ({pair id: (sum, tokens)}): the mean loss and TRL's metrics."""
    keys = sorted(k for k in policy if k > 0)
    avg = loss_type == "ipo"
    pc, pr = pair_logps(policy, 1, avg), pair_logps(policy, -1, avg)
    rc, rr = pair_logps(reference, 1, avg), pair_logps(reference, -1, avg)
    logits = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(loss_type)
    loss = losses.mean()
    if rpo_alpha is not None:  # the NLL over every chosen completion token of the batch
        loss = loss + rpo_alpha * -sum(policy[k][0] for k in keys) / sum(policy[k][1] for k in keys)
    chosen, rejected = dpo_rewards(policy, reference, beta, loss_type)
    return loss, {"rewards/chosen": chosen.mean(), "rewards/rejected": rejected.mean(),
                  "rewards/margins": (chosen - rejected).mean(),
                  "rewards/accuracies": (chosen > rejected).double().mean(),
                  "logps/chosen": pair_logps(policy, 1, False).mean(),
                  "logps/rejected": pair_logps(policy, -1, False).mean()}


def models(fixture, vocab):
    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  eos_token_id=0, pad_token_id=0, tie_word_embeddings=False, attn_implementation="eager")
    llama = AutoModelForCausalLM.from_pretrained(fixture, torch_dtype=torch.float64, attn_implementation="eager")
    qwen = Qwen2ForCausalLM(Qwen2Config(**common)).double()
    return {"llama": llama.eval(), "qwen2": qwen.eval()}


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    torch.set_grad_enabled(False)
    float64_softmax()
    py = sys.executable
    failed = 0

    def expect(ok, what):
        nonlocal failed
        failed += not ok
        print(("ok   " if ok else "FAIL ") + what, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        fx, data = os.path.join(tmp, "fx"), os.path.join(tmp, "pairs")
        subprocess.run([py, os.path.join(src, "tests/ref/chat_fixture.py"), fx, "--model"], check=True)
        u = lambda c: {"role": "user", "content": c}
        a = lambda c: {"role": "assistant", "content": c}
        rows = [{"prompt": "what is the next word after alpha?", "chosen": " beta", "rejected": " gamma delta"},
                {"prompt": [u("say mu twice")], "chosen": [a("mu mu")], "rejected": [a("nu")]},
                {"chosen": [u("say xi"), a("xi")], "rejected": [u("say xi"), a("pi pi pi")]},
                {"prompt": "say it twice please:", "chosen": " tau tau", "rejected": " tau"},
                {"prompt": "you are a helpful assistant", "chosen": " ok", "rejected": " ok ok ok ok"}]
        with open(os.path.join(tmp, "pairs.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        S = 64
        p = subprocess.run([py, os.path.join(src, "scripts/prepare_data.py"), "--preference", "--tokenizer", fx,
                            "--seq-len", str(S), "--val-fraction", "0", "--out", data, os.path.join(tmp, "pairs.jsonl")],
                           capture_output=True, text=True)
        expect(p.returncode == 0, f"prepare_data.py --preference: {p.stderr.strip()[-200:]}")
        if p.returncode:
            return 1
        vocab = json.load(open(os.path.join(data, "data.json")))["model"]["vocab_size"]
        seqs = sequences(data)
        expect(sorted(seqs) == sorted([k for i in range(1, len(rows) + 1) for k in (i, -i)]),
               f"every pair's two sequences are in the shards: {sorted(seqs)}")
        for name, model in models(fx, vocab).items():
            packed, trl = packed_sequence_logps(model, data, S), trl_sequence_logps(model, seqs)
            worst = max(abs(float(packed[k][0] - trl[k][0])) for k in trl)
            expect(sorted(packed) == sorted(trl) and all(packed[k][1] == trl[k][1] for k in trl) and worst < 1e-10,
                   f"{name}: packed windows' log-probabilities by pair id equal TRL's per sequence (worst {worst:.1e})")
            ref = trl
            lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                    init_lora_weights=False))
            lora.eval()
            policy = packed_sequence_logps(lora, data, S)
            with lora.disable_adapter():
                off = packed_sequence_logps(lora, data, S)
            worst_off = max(abs(float(off[k][0] - ref[k][0])) for k in ref)
            expect(worst_off < 1e-10, f"{name} + LoRA: the adapters disabled give the base's log-probabilities "
                   f"(worst {worst_off:.1e})")
            moved = min(abs(float(policy[k][0] - ref[k][0])) for k in ref)
            expect(moved > 1e-6, f"{name} + LoRA: the adapted policy differs from the reference ({moved:.1e})")
            trl_policy = trl_sequence_logps(lora, seqs)
            for kind, kw in (("sigmoid", {}), ("sigmoid", {"label_smoothing": 0.2}), ("ipo", {}),
                             ("sigmoid", {"rpo_alpha": 0.5})):
                l1, m1 = trl_dpo(policy, off, beta=0.1, loss_type=kind, **kw)
                l2, m2 = trl_dpo(trl_policy, ref, beta=0.1, loss_type=kind, **kw)
                diff = max([abs(float(l1 - l2))] + [abs(float(m1[key] - m2[key])) for key in m1])
                expect(diff < 1e-10,
                       f"{name} + LoRA, {kind} {kw}: DPO loss {float(l1):.6f} and metrics from the packed windows "
                       f"equal TRL's (worst {diff:.1e})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
