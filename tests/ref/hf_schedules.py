#!/usr/bin/env python3
"""train.lr_schedule against Hugging Face transformers' schedulers, step for step: autosp-train runs a
tiny model with --metrics (one row per step: the lr step s was taken with) and transformers'
get_scheduler drives a torch optimizer the way the Trainer does (the lr an optimizer step uses, then
scheduler.step()). Our 0-based step s is metrics row s + 1 and HF's optimizer step s.
  - linear, constant, constant_with_warmup, cosine_with_min_lr, wsd: equal (relative 1e-12);
  - cosine (ours): HF's cosine_with_min_lr with the warm-up counted from 1, i.e. step s < W gets
    HF's lr of step s + 1 and every later step HF's own;
  - wsd: transformers < 4.50 (the venv has 4.44) warms up from 0 and has only the cosine decay; the
    current one warms up from min_lr and has decay_type. With 4.44 the wsd rows whose min_lr is not 0
    compare from the end of the warm-up on, and the other decay types are checked by hand values in
    tests/train/test_schedule.cpp; with a newer transformers every row compares whole.
Needs the venv of scripts/hf-venv.sh (exit 77, a ctest skip, without it).
  hf_schedules.py BIN_DIR
"""
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    print("skip: no transformers (scripts/hf-venv.sh creates its venv)")
    sys.exit(77)

CONFIG = {"model": {"arch": "llama", "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 1,
                    "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 16},
          "data": {"source": "synthetic", "seq_len": 8, "batch_size": 1},
          "train": {"log_every": 1, "grad_clip": 0},
          "runtime": {"threads": 1}}

def start(bin_dir, tmp, name, steps, train):
    """autosp-train on `train`'s keys, started (the runs go in parallel while transformers imports)."""
    cfg = json.loads(json.dumps(CONFIG))
    cfg["train"].update(train, steps=steps)
    path = os.path.join(tmp, name + ".json")
    metrics = os.path.join(tmp, name + ".jsonl")
    with open(path, "w") as f:
        json.dump(cfg, f)
    proc = subprocess.Popen([os.path.join(bin_dir, "autosp-train"), "--config", path, "--metrics", metrics, "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, metrics, steps, name


def finish(run):
    """The lr of each step of a started run."""
    proc, metrics, steps, name = run
    _, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{name}: autosp-train failed ({proc.returncode}): {err[-2000:]}")
    rows = [json.loads(line) for line in open(metrics)]
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), f"{name}: metrics steps {[r['step'] for r in rows]}"
    return [r["lr"] for r in rows]


def hf(name, lr, steps, warmup, horizon, **kwargs):
    import torch
    from transformers import get_scheduler
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=horizon,
                          scheduler_specific_kwargs=kwargs or None)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def main():
    bin_dir = sys.argv[1]
    lr = 1e-3
    failures = 0
    # Both WSD generations' rows are run; the newer ones compare only with transformers >= 4.50.
    # name, our train keys, steps, HF scheduler name, its warm-up, horizon and kwargs, first compared step
    cases = [
        ("linear", {"lr_schedule": "linear", "warmup_steps": 3}, 20, "linear", 3, 20, {}),
        ("linear_w0", {"lr_schedule": "linear", "warmup_steps": 0}, 10, "linear", 0, 10, {}),
        ("linear_horizon", {"lr_schedule": "linear", "warmup_steps": 2, "schedule_steps": 10}, 14, "linear", 2, 10, {}),
        ("constant", {"lr_schedule": "constant"}, 8, "constant", 0, 8, {}),
        ("constant_with_warmup", {"lr_schedule": "constant_with_warmup", "warmup_steps": 5}, 12,
         "constant_with_warmup", 5, 12, {}),
        ("cosine_with_min_lr", {"lr_schedule": "cosine_with_min_lr", "warmup_steps": 4, "min_lr": 1e-4}, 20,
         "cosine_with_min_lr", 4, 20, {"min_lr": 1e-4}),
        ("cosine_to_zero", {"lr_schedule": "cosine_with_min_lr", "warmup_steps": 0, "min_lr": 0}, 10,
         "cosine", 0, 10, {}),
        ("wsd", {"lr_schedule": "wsd", "warmup_steps": 3, "decay_fraction": 0.25, "min_lr": 0}, 20,
         "warmup_stable_decay", 3, 20, {"num_stable_steps": 12, "num_decay_steps": 5, "min_lr_ratio": 0.0}),
        ("wsd_min_lr", {"lr_schedule": "wsd", "warmup_steps": 3, "decay_fraction": 0.25, "min_lr": 1e-4}, 20,
         "warmup_stable_decay", 3, 20, {"num_stable_steps": 12, "num_decay_steps": 5, "min_lr_ratio": 0.1}),
    ]
    for decay in ("linear", "1-sqrt"):
        cases.append((f"wsd_{decay}", {"lr_schedule": "wsd", "warmup_steps": 3, "decay_fraction": 0.25,
                                       "decay_type": decay, "min_lr": 1e-4}, 20, "warmup_stable_decay", 3, 20,
                      {"num_stable_steps": 12, "num_decay_steps": 5, "min_lr_ratio": 0.1, "decay_type": decay}))
    with tempfile.TemporaryDirectory() as tmp:
        runs = [start(bin_dir, tmp, name, steps, dict(train, lr=lr)) for name, train, steps, *_ in cases]
        cosine_run = start(bin_dir, tmp, "cosine", 20, {"lr_schedule": "cosine", "warmup_steps": 4, "lr": lr,
                                                        "min_lr": 1e-4})
        import transformers
        from transformers.optimization import get_wsd_schedule
        new_wsd = "decay_type" in inspect.signature(get_wsd_schedule).parameters  # transformers >= 4.50
        for run, (name, train, steps, hf_name, warmup, horizon, kwargs) in zip(runs, cases):
            got = finish(run)
            if "decay_type" in kwargs and not new_wsd:
                continue
            want = hf(hf_name, lr, steps, warmup, horizon, **kwargs)
            first = warmup if name == "wsd_min_lr" and not new_wsd else 0
            bad = [s for s in range(first, steps) if abs(got[s] - want[s]) > 1e-12 * abs(want[s]) + 1e-18]
            print(f"{'ok  ' if not bad else 'FAIL'} {name}: {steps - first} steps against {hf_name}"
                  + (f" from step {first}" if first else ""))
            for s in bad[:5]:
                print(f"    step {s}: ours {got[s]!r}, transformers {want[s]!r}")
            failures += bool(bad)

        # Ours: HF's cosine_with_min_lr with the warm-up from 1 (step s < W takes HF's step s + 1).
        steps, warmup = 20, 4
        got = finish(cosine_run)
        want = hf("cosine_with_min_lr", lr, steps + 1, warmup, steps, min_lr=1e-4)
        want = [want[s + 1] if s < warmup else want[s] for s in range(steps)]
        bad = [s for s in range(steps) if abs(got[s] - want[s]) > 1e-12 * abs(want[s])]
        print(f"{'ok  ' if not bad else 'FAIL'} cosine: {steps} steps against cosine_with_min_lr, warm-up from 1")
        for s in bad[:5]:
            print(f"    step {s}: ours {got[s]!r}, transformers {want[s]!r}")
        failures += bool(bad)
    print(f"hf_schedules: transformers {transformers.__version__}, {'all passed' if not failures else f'{failures} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
