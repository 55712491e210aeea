#!/usr/bin/env python3
"""autosp-train's curves read back by the tools people use: the TensorBoard event files of
train.tensorboard_dir with TensorBoard's own reader (EventAccumulator, which checks every record's
masked CRC-32C), and train.csv_dir's metrics.csv with the csv module; each scalar must equal the
step's --metrics value (float32 in the event file), every step, under mpirun with 2 ranks (rank 0
writes). A DeepSpeed file's "tensorboard" and "csv_monitor" sections write to output_path/job_name.
Needs the venv of scripts/hf-venv.sh with tensorboard (exit 77, a ctest skip, without it).
  tensorboard_events.py BIN_DIR
"""
import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"skipped: tensorboard is not importable ({e}); run scripts/hf-venv.sh", file=sys.stderr)
    sys.exit(77)

STEPS = 6
TAGS = {"train/loss": "loss", "train/learning_rate": "lr", "train/grad_norm": "grad_norm",
        "train/tokens_per_sec": "tokens_per_sec", "train/accuracy": "accuracy", "train/mfu": "mfu"}


def run(bin_dir, work, extra, np_=1, name="run"):
    cfg = {"model": {"arch": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
           "data": {"source": "synthetic", "seq_len": 16, "batch_size": 2},
           "train": {"steps": STEPS, "log_every": 1, "eval_every": 3, "eval_batches": 1, "warmup_steps": 2},
           "runtime": {"threads": 1, "peak_tflops": 1.0}}
    path = os.path.join(work, f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    metrics = os.path.join(work, f"{name}.jsonl")
    cmd = [os.path.join(bin_dir, "autosp-train"), "--config", path, "--metrics", metrics, "--quiet", *extra]
    if np_ > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(np_), *cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=work)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    with open(metrics) as f:
        return [json.loads(line) for line in f if line.strip()]


def close(a, b):
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))  # the event file holds float32


def check_events(tb_dir, rows):
    files = glob.glob(os.path.join(tb_dir, "events.out.tfevents.*"))
    assert len(files) == 1, files
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == set(TAGS) | {"eval/loss", "eval/accuracy"}, tags
    for tag, key in TAGS.items():
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [r["step"] for r in rows], (tag, [e.step for e in events])
        for e, r in zip(events, rows):
            assert close(e.value, r[key]), (tag, e.step, e.value, r[key])
    evals = [r for r in rows if "val_loss" in r]
    assert [e.step for e in acc.Scalars("eval/loss")] == [r["step"] for r in evals] == [3, 6]
    for e, r in zip(acc.Scalars("eval/loss"), evals):
        assert close(e.value, r["val_loss"]), (e.value, r["val_loss"])
    print(f"{tb_dir}: {len(tags)} tags × {len(rows)} steps equal --metrics (TensorBoard's EventAccumulator)")


def check_csv(path, rows):
    with open(path) as f:
        table = list(csv.DictReader(f))
    assert [int(t["step"]) for t in table] == [r["step"] for r in rows]
    for t, r in zip(table, rows):
        for key in ("loss", "lr", "grad_norm", "mfu"):
            assert float(t[key]) == r[key], (key, t[key], r[key])
        assert (t["val_loss"] != "") == ("val_loss" in r)
    print(f"{path}: {len(table)} rows equal --metrics")


def main():
    bin_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/bin")
    work = tempfile.mkdtemp(prefix="autosp-tb-")
    try:
        rows = run(bin_dir, work, ["--set", "train.tensorboard_dir=tb", "--set", "train.csv_dir=csv"], np_=2)
        assert len(rows) == STEPS
        check_events(os.path.join(work, "tb"), rows)
        check_csv(os.path.join(work, "csv", "metrics.csv"), rows)
        ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "tensorboard": {"enabled": True, "output_path": "ds_logs", "job_name": "job1"},
              "csv_monitor": {"enabled": True, "output_path": "ds_csv/"}}
        with open(os.path.join(work, "deepspeed.json"), "w") as f:
            json.dump(ds, f)
        rows = run(bin_dir, work, ["--deepspeed", "deepspeed.json"], name="ds")
        check_events(os.path.join(work, "ds_logs", "job1"), rows)
        check_csv(os.path.join(work, "ds_csv", "DeepSpeedJobName", "metrics.csv"), rows)
        print("tensorboard events: ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
