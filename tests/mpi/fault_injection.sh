#!/usr/bin/env bash
# Failures across ranks, injected with AUTOSP_FAULT into a 2-rank SP training run (ctest runs one
# KIND per test, each with a 60 s TIMEOUT):
#   exit|abort|crash|hang|nan  rank 1 fails at the start of step 4 (checkpoints every 2 steps; nan:
#       its step 4 gradients become NaN): the job must end well within the bound, with a non-zero
#       exit code and a clear message, and the last checkpoint (step 2) must load and train on in a
#       single process.
#   nan-zero3              nan at zero_optimization.stage 3, whose gradients the graph reduce-scatters
#       (no bucket): the injection must reach them too.
#   checkpoint-crash       rank 0 dies of SIGSEGV while writing step 4's checkpoint (files written,
#       not yet renamed): step 4 must not appear, and --resume must continue from step 2 with the
#       same losses as an uninterrupted run.
# Usage: fault_injection.sh KIND BIN_DIR
set -u
kind=$1
bin=$2/autosp-train
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun=(mpirun --oversubscribe -np 2)
fail=0
say_fail() {
  echo "FAIL ($kind): $*"
  fail=1
}

cat >"$tmp/cfg.json" <<'JSON'
{"model": {"arch": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
 "data": {"source": "synthetic", "seq_len": 30, "batch_size": 2},
 "train": {"steps": 6, "log_every": 1, "checkpoint_every": 2},
 "sequence_parallel": {"autosp_size": 2},
 "runtime": {"threads": 1}}
JSON

# run LOG ARGS... : the job under a hard 50 s limit; sets rc and elapsed.
run() {
  local log=$1
  shift
  local start=$SECONDS
  timeout -k 5 50 "$@" >"$log" 2>&1
  rc=$?
  elapsed=$((SECONDS - start))
}

case $kind in
  exit | abort | crash | hang | nan | nan-zero3)
    extra=()
    [ "$kind" = nan-zero3 ] && kind=nan extra=(--set zero_optimization.stage=3)
    # The hang is ended by rank 0's watchdog: a 5 s limit on one collective.
    AUTOSP_COLLECTIVE_TIMEOUT=5 AUTOSP_FAULT="rank:1,step:4,kind:$kind" \
      run "$tmp/log" "${mpirun[@]}" "$bin" --config "$tmp/cfg.json" --set "train.checkpoint_dir=$tmp/ck" --quiet \
      "${extra[@]}"
    echo "--- fault run: exit code $rc after ${elapsed}s"
    cat "$tmp/log"
    echo "---"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && say_fail "the job did not end within 50 s"
    [ $rc -eq 0 ] && say_fail "the job exited 0"
    [ $elapsed -le 30 ] || say_fail "the job took ${elapsed}s (bound 30 s)"
    case $kind in
      exit) needle='^error: AUTOSP_FAULT: rank 1 injected exit\(3\) at step 4$' want_rc=3 ;;
      abort) needle='^error: AUTOSP_FAULT: rank 1 injected abort at step 4$' want_rc=3 ;;
      crash) needle='rank 1 .*exited on signal 11' want_rc=any ;;
      hang) needle='^error: rank 0 waited more than 5 s in .* at step 4: another rank has died or hangs' want_rc=3 ;;
      nan) needle="^error: step 4: loss [0-9.]*, gradient norm nan is not finite; stopping before the update .*--resume $tmp/ck/step_00000002\)$" want_rc=3 ;;
    esac
    grep -Eq "$needle" "$tmp/log" || say_fail "no line matching /$needle/"
    [ "$want_rc" = any ] || [ $rc -eq "$want_rc" ] || say_fail "exit code $rc, expected $want_rc"
    [ -f "$tmp/ck/step_00000002/meta.json" ] || say_fail "the step 2 checkpoint is missing"
    [ -e "$tmp/ck/step_00000004" ] && say_fail "a step 4 checkpoint exists"
    # The last checkpoint loads and trains on, in one process.
    run "$tmp/resume.log" "$bin" --config "$tmp/cfg.json" --set sequence_parallel.autosp_size=1 \
      --resume "$tmp/ck" --steps 3 --quiet
    [ $rc -eq 0 ] || say_fail "resuming from the last checkpoint exited $rc: $(grep -m2 error "$tmp/resume.log")"
    grep -q "resumed from $tmp/ck at step 2" "$tmp/resume.log" || say_fail "the resumed run did not start from step 2"
    ;;

  checkpoint-crash)
    run "$tmp/full.log" "${mpirun[@]}" "$bin" --config "$tmp/cfg.json" --set "train.checkpoint_dir=$tmp/full" \
      --metrics "$tmp/full.jsonl" --quiet
    [ $rc -eq 0 ] || say_fail "uninterrupted run exited $rc: $(tail -3 "$tmp/full.log")"
    AUTOSP_FAULT="rank:0,step:4,kind:crash,where:checkpoint" \
      run "$tmp/crash.log" "${mpirun[@]}" "$bin" --config "$tmp/cfg.json" --set "train.checkpoint_dir=$tmp/ck" --quiet
    echo "--- crash run: exit code $rc after ${elapsed}s"
    cat "$tmp/crash.log"
    echo "---"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] || say_fail "crash run exited $rc"
    grep -q "rank 0 injected SIGSEGV at step 4 while writing its checkpoint" "$tmp/crash.log" ||
      say_fail "the fault did not fire"
    ls -a "$tmp/ck"
    [ -f "$tmp/ck/step_00000002/meta.json" ] || say_fail "the step 2 checkpoint is missing"
    [ -e "$tmp/ck/step_00000004" ] && say_fail "a step 4 checkpoint appeared although its write was killed"
    compgen -G "$tmp/ck/.step_00000004.tmp.*/optimizer.safetensors" >/dev/null ||
      say_fail "no half-written step 4 directory: the crash did not happen mid-write"
    run "$tmp/resume.log" "${mpirun[@]}" "$bin" --config "$tmp/cfg.json" --set "train.checkpoint_dir=$tmp/ck" \
      --resume "$tmp/ck" --metrics "$tmp/resume.jsonl" --quiet
    [ $rc -eq 0 ] || say_fail "resumed run exited $rc: $(tail -3 "$tmp/resume.log")"
    grep -q "resumed from $tmp/ck at step 2" "$tmp/resume.log" || say_fail "did not resume from step 2"
    compgen -G "$tmp/ck/.step_*" >/dev/null && say_fail "the dead writer's temporary directory was not cleaned up"
    # The run log in the checkpoint directory kept both runs, progress lines included (--quiet).
    log=$tmp/ck/train.log
    for needle in 'autosp-train --config' '"keep_checkpoints":3' 'step 3/6 | loss' 'saved checkpoint .*step_00000002' \
                  'injected SIGSEGV at step 4 while writing its checkpoint' "resumed from $tmp/ck at step 2" \
                  'done: 4 steps (to step 6)'; do
      grep -q -- "$needle" "$log" || say_fail "train.log has no line matching '$needle'"
    done
    $py - "$tmp" <<'PY' || say_fail "resumed losses differ from the uninterrupted run"
import json, sys
tmp = sys.argv[1]
full = {r["step"]: r["loss"] for r in map(json.loads, open(tmp + "/full.jsonl"))}
res = [json.loads(l) for l in open(tmp + "/resume.jsonl")]
print("uninterrupted:", full)
print("resumed:      ", {r["step"]: r["loss"] for r in res})
assert [r["step"] for r in res] == [3, 4, 5, 6], res
assert all(r["loss"] == full[r["step"]] for r in res)
PY
    ;;

  *)
    echo "usage: fault_injection.sh exit|abort|crash|hang|nan|checkpoint-crash BIN_DIR"
    exit 2
    ;;
esac

if [ $fail -eq 0 ]; then echo "fault_injection $kind: all checks passed"; fi
exit $fail
