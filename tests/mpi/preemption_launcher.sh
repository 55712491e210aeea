#!/usr/bin/env bash
# Preemption of a job started by scripts/preemptible-mpirun.sh (docs/reliability.md): SIGTERM,
# SIGINT or SIGHUP sent to the launcher (as Kubernetes, `kill` of the job or a terminal's Ctrl-C
# send it) make the two ranks finish the step, save and exit 4, through mpirun's forwarding of
# SIGUSR1. Signalling a bare mpirun instead kills the ranks after Open MPI's one-second
# odls_base_sigkill_timeout and exits 1; that is printed, not checked (it is Open MPI's behaviour).
#   preemption_launcher.sh BIN_DIR MPIEXEC [MPI FLAGS...]
set -u
set -m  # the launcher as a job of its own, so that SIGINT is not ignored in it
bin=$1/autosp-train
export AUTOSP_MPIRUN=$2
shift 2
launcher="$(dirname "$0")/../../scripts/preemptible-mpirun.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
cat >"$tmp/cfg.json" <<JSON
{"model": {"arch": "llama", "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96},
 "data": {"source": "synthetic", "seq_len": 64, "batch_size": 2},
 "train": {"steps": 100000, "log_every": 1, "checkpoint_every": 0},
 "sequence_parallel": {"autosp_size": 2}, "runtime": {"threads": 1}}
JSON
fail=0

# run SIG LAUNCH...: starts the job, waits for 3 logged steps, sends SIG to the launching process;
# sets rc and ck (the checkpoint directory).
run() {
  local sig=$1
  shift
  ck=$tmp/ck-$sig-$#
  rm -f "$tmp/run.jsonl"
  "$@" -np 2 "$bin" --config "$tmp/cfg.json" --set "train.checkpoint_dir=$ck" --metrics "$tmp/run.jsonl" \
    --quiet >"$tmp/run.log" 2>&1 &
  local job=$!
  for _ in $(seq 300); do [ -f "$tmp/run.jsonl" ] && [ "$(wc -l <"$tmp/run.jsonl")" -ge 3 ] && break; sleep 0.1; done
  kill -"$sig" $job
  wait $job
  rc=$?
}

for sig in TERM INT HUP; do
  run $sig bash "$launcher" "$@"
  saved=$(cd "$ck" 2>/dev/null && ls -d step_* 2>/dev/null | tail -1)
  echo "SIG$sig to the launcher: exit $rc, checkpoint ${saved:-none}"
  [ $rc -eq 4 ] || { echo "FAIL: exit code $rc, expected 4"; tail -5 "$tmp/run.log"; fail=1; }
  [ -n "$saved" ] || { echo "FAIL: no checkpoint written"; fail=1; }
  grep -q "stopping after step" "$ck/train.log" 2>/dev/null || { echo "FAIL: train.log does not log the stop"; fail=1; }
done

run TERM "$AUTOSP_MPIRUN" "$@"
echo "for comparison, SIGTERM to a bare mpirun: exit $rc, checkpoint $(cd "$ck" 2>/dev/null && ls -d step_* 2>/dev/null | tail -1)"

if [ $fail -eq 0 ]; then echo "preemption through the launcher: all checks passed"; fi
exit $fail
