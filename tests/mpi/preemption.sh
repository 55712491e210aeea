#!/usr/bin/env bash
# Preemption through autosp-train under mpirun (docs/reliability.md): SIGTERM (or SIGUSR1) during a
# run makes every rank finish the step, rank 0 write a checkpoint and the job exit with code 4;
# --resume then gives the same losses, bit for bit, as a run that was never interrupted. NP 1
# signals its one rank, NP 2 only rank 1 (the ranks agree on the step), NP 4 every rank.
#   preemption.sh NP BIN_DIR MPIEXEC [MPI FLAGS...]
set -u
np=$1
bin=$2/autosp-train
mpiexec=$3
shift 3
mpi=("$mpiexec" "$@" -np "$np")
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fail=0

# A constant learning rate (no warmup, min_lr = lr), so runs of different lengths agree step by step.
sp=1
[ "$np" -ge 2 ] && sp=2
cat >"$tmp/cfg.json" <<JSON
{"model": {"arch": "llama", "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96},
 "data": {"source": "synthetic", "seq_len": 64, "batch_size": 2},
 "train": {"steps": 100000, "log_every": 1, "warmup_steps": 0, "lr": 0.001, "min_lr": 0.001,
           "checkpoint_every": 0},
 "sequence_parallel": {"autosp_size": $sp},
 "runtime": {"threads": 1}}
JSON

"${mpi[@]}" "$bin" --config "$tmp/cfg.json" --set "train.checkpoint_dir=$tmp/ck" --metrics "$tmp/run.jsonl" \
  --quiet >"$tmp/run.log" 2>&1 &
job=$!
for _ in $(seq 300); do [ -f "$tmp/run.jsonl" ] && [ "$(wc -l <"$tmp/run.jsonl")" -ge 3 ] && break; sleep 0.1; done
ranks=($(pgrep -P $job -x autosp-train))
[ "$np" -eq 1 ] && [ ${#ranks[@]} -eq 0 ] && ranks=($job)  # no mpirun child: the process itself
case $np in
  2) kill -TERM "${ranks[1]}" ;;
  *) kill -TERM "${ranks[@]}" ;;
esac
start=$SECONDS
wait $job
rc=$?
echo "--- preempted run: exit $rc after $((SECONDS - start)) s; ranks ${ranks[*]}"
tail -5 "$tmp/run.log"
[ $rc -eq 4 ] || { echo "FAIL: exit code $rc, expected 4"; fail=1; }
[ $((SECONDS - start)) -le 30 ] || { echo "FAIL: the save took more than 30 s"; fail=1; }
grep -q "stopping after step" "$tmp/ck/train.log" || { echo "FAIL: train.log does not log the stop"; fail=1; }
saved=$(cd "$tmp/ck" && ls -d step_* 2>/dev/null | tail -1)
[ -n "$saved" ] || { echo "FAIL: no checkpoint written"; exit 1; }
k=$((10#${saved#step_}))
echo "saved $saved (step $k)"

# Resume for 3 more steps, and the reference: the same 3 steps without the interruption.
"${mpi[@]}" "$bin" --config "$tmp/cfg.json" --set "train.checkpoint_dir=$tmp/ck" --resume "$tmp/ck" \
  --steps $((k + 3)) --metrics "$tmp/resumed.jsonl" --quiet >"$tmp/resume.log" 2>&1 ||
  { echo "FAIL: resume: $(tail -3 "$tmp/resume.log")"; fail=1; }
"${mpi[@]}" "$bin" --config "$tmp/cfg.json" --steps $((k + 3)) --metrics "$tmp/ref.jsonl" --quiet >"$tmp/ref.log" 2>&1 ||
  { echo "FAIL: reference: $(tail -3 "$tmp/ref.log")"; fail=1; }
$py - "$tmp" "$k" <<'PY' || fail=1
import json, sys
tmp, k = sys.argv[1], int(sys.argv[2])
rows = lambda f: {r["step"]: r["loss"] for r in map(json.loads, open(f"{tmp}/{f}"))}
run, resumed, ref = rows("run.jsonl"), rows("resumed.jsonl"), rows("ref.jsonl")
assert all(run[s] == ref[s] for s in range(1, k + 1)), "the preempted run differs from the reference before the stop"
after = [s for s in range(k + 1, k + 4)]
assert [resumed.get(s) for s in after] == [ref[s] for s in after], ("resumed", [resumed.get(s) for s in after], "reference", [ref[s] for s in after])
print("steps", after, "bit-identical after the resume")
PY
if [ $fail -eq 0 ]; then echo "preemption np $np: all checks passed"; fi
exit $fail
