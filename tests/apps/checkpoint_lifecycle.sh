#!/usr/bin/env bash
# The checkpoint lifecycle through autosp-train (docs/reliability.md "Lifecycle"): a used
# checkpoint_dir needs --resume or --start-over (which moves its steps aside); one live run per
# directory; resuming an older step moves the newer ones aside and `--resume ROOT` then continues
# the branch; outputs may not land in a checkpoint or on an input; a failed metrics write is exit 3;
# a closed stderr pipe does not kill the run; a command that exits 2 changes nothing on disk.
#   checkpoint_lifecycle.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-train
py=/usr/bin/python3
fail=0
tmp=$(mktemp -d)
trap 'kill $live 2>/dev/null; rm -rf "$tmp"' EXIT
live=""
export OMP_NUM_THREADS=1

cat >"$tmp/cfg.json" <<'JSON'
{"model": {"arch": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
 "data": {"source": "synthetic", "seq_len": 16, "batch_size": 2},
 "train": {"steps": 6, "log_every": 1, "checkpoint_every": 2, "keep_checkpoints": 0},
 "runtime": {"threads": 1}}
JSON
ck=$tmp/ck
c=(--config "$tmp/cfg.json" --set "train.checkpoint_dir=$ck" --quiet)

expect() {  # expect RC 'NEEDLE' ARGS... : the run exits RC with an `error:` line matching NEEDLE ('' = none)
  local want=$1 needle=$2
  shift 2
  timeout -k 5 60 "$bin" "$@" >"$tmp/out" 2>&1 </dev/null
  local rc=$?
  if [ $rc -ne "$want" ]; then
    echo "FAIL: $* exited $rc, expected $want:"
    tail -5 "$tmp/out" | sed 's/^/    /'
    fail=1
  elif [ -n "$needle" ] && ! grep -q "^error: .*$needle" "$tmp/out"; then
    echo "FAIL: $* printed no 'error:' line matching '$needle':"
    tail -5 "$tmp/out" | sed 's/^/    /'
    fail=1
  else
    echo "ok: exit $rc: $(grep -m1 '^error:' "$tmp/out" | cut -c1-140)"
  fi
}
steps_in() { (cd "$1" && ls -d step_* 2>/dev/null | tr '\n' ' '); }

expect 0 '' "${c[@]}"
[ "$(steps_in "$ck")" = "step_00000002 step_00000004 step_00000006 " ] || { echo "FAIL: steps $(steps_in "$ck")"; fail=1; }

# A used directory: a fresh run would prune or be outranked by the old run's steps.
expect 2 "already holds step_00000006 of an earlier run" "${c[@]}"
expect 0 '' "${c[@]}" --start-over --steps 2
aside=$(ls -d "$ck"/previous-* | head -1)
[ "$(steps_in "$ck")" = "step_00000002 " ] || { echo "FAIL: after --start-over: $(steps_in "$ck")"; fail=1; }
[ "$(steps_in "$aside")" = "step_00000002 step_00000004 step_00000006 " ] ||
  { echo "FAIL: moved aside: $(steps_in "$aside")"; fail=1; }

# Branching: resume step 2 of a 6-step run, so steps 4 and 6 move aside, and ROOT means the branch.
rm -rf "$ck" && expect 0 '' "${c[@]}"
expect 0 '' "${c[@]}" --resume "$ck/step_00000002" --steps 4 --set train.lr=0.002
[ "$(steps_in "$ck")" = "step_00000002 step_00000004 " ] || { echo "FAIL: after branching: $(steps_in "$ck")"; fail=1; }
[ "$(ls -d "$ck"/previous-* | wc -l)" -eq 1 ] || { echo "FAIL: no previous-* directory after branching"; fail=1; }
grep -q "resumed from $ck/step_00000002 at step 2" "$tmp/out" || grep -q "resumed from" "$ck/train.log" ||
  { echo "FAIL: the branch did not log its resume"; fail=1; }
expect 0 '' "${c[@]}" --resume "$ck" --steps 6 --set train.lr=0.002
grep -q "resumed from $ck at step 4" "$ck/train.log" || { echo "FAIL: --resume ROOT did not continue the branch"; fail=1; }

# One live run per directory.
rm -rf "$ck"
"$bin" "${c[@]}" --steps 100000 --set train.checkpoint_every=0 >"$tmp/live.out" 2>&1 &
live=$!
for _ in $(seq 100); do [ -s "$ck/.lock" ] && break; sleep 0.1; done
expect 2 "another run is writing checkpoints here" "${c[@]}" --start-over
kill $live && wait $live 2>/dev/null
live=""

# Outputs: not into a checkpoint, not onto an input.
rm -rf "$ck" && expect 0 '' "${c[@]}"
expect 2 "--metrics .*is inside" "${c[@]}" --resume "$ck" --metrics "$ck/step_00000004/m.jsonl"
expect 2 "--metrics .*is inside the checkpoint" "${c[@]}" --resume "$ck/step_00000006" --metrics "$ck/step_00000002/m.jsonl"
expect 2 "--metrics .*which this run reads" "${c[@]}" --resume "$ck" --metrics "$tmp/cfg.json"
expect 2 "--dump-grads .*is inside" "${c[@]}" --resume "$ck" --dump-grads "$ck/step_00000006/model.safetensors"
# A failed write is exit 3 naming the file, not a silent short file; a device is never replaced.
expect 3 "/dev/full" --config "$tmp/cfg.json" --quiet --metrics /dev/full
expect 2 "--dump-grads /dev/full: is not a regular file" --config "$tmp/cfg.json" --quiet --dump-grads /dev/full
[ -c /dev/full ] || { echo "FAIL: /dev/full is no longer a device"; fail=1; }
# A closed stderr pipe: the run goes on and finishes (SIGPIPE ignored).
"$bin" --config "$tmp/cfg.json" --metrics "$tmp/pipe.jsonl" 2> >(head -c 1 >/dev/null)
rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$tmp/pipe.jsonl")" -eq 6 ] ||
  { echo "FAIL: with stderr closed the run exited $rc with $(wc -l <"$tmp/pipe.jsonl") metrics lines"; fail=1; }

# A command that exits 2 changes nothing on disk (docs/reliability.md): every refusal of a resume or
# of --start-over, wherever the run finds it (the checkpoint, the data position, the data itself),
# leaves the checkpoints where they were and writes no output; `--resume ROOT` then still means the
# newest step. (Before issue 48 a branch or --start-over moved the newer steps aside first.)
$py - "$tmp" <<'PY'
import os, struct, sys
def shard(path, n):
    toks = [(t * 7) % 32 for t in range(n)]
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % n, *toks))
shard(os.path.join(sys.argv[1], "d.bin"), 2000)
shard(os.path.join(sys.argv[1], "d_other.bin"), 1500)
PY
ck2=$tmp/ck2
t=(--config "$tmp/cfg.json" --set "train.checkpoint_dir=$ck2" --quiet --set data.source=tokens
   --set "data.path=$tmp/d.bin" --set data.shuffle=true)
snapshot() { (cd "$ck2" && find . -path ./train.log -prune -o -path ./.lock -prune -o -printf '%p %s %T@\n' | sort); }
expect 0 '' "${t[@]}"
before=$(snapshot)
refuse() {  # refuse 'NEEDLE' ARGS...: exit 2 naming NEEDLE, and the directory exactly as it was
  expect 2 "$@" --metrics "$tmp/refused.jsonl"
  [ "$(snapshot)" = "$before" ] || { echo "FAIL: exit 2 changed $ck2:"; diff <(echo "$before") <(snapshot) | head; fail=1; }
  [ ! -e "$tmp/refused.jsonl" ] || { echo "FAIL: a refused run created its --metrics file"; fail=1; rm -f "$tmp/refused.jsonl"; }
}
refuse "data.seed changed (1234 → 5) within shuffled epoch" "${t[@]}" --resume "$ck2/step_00000002" --set data.seed=5
refuse "data.seq_len changed (16 → 8) within shuffled epoch" "${t[@]}" --resume "$ck2/step_00000002" --set data.seq_len=8
refuse "data.shuffle changed (true → false)" "${t[@]}" --resume "$ck2/step_00000002" --set data.shuffle=false
refuse "the data changed" "${t[@]}" --resume "$ck2/step_00000002" --set "data.path=$tmp/d_other.bin"
refuse "was written with train.seed 1234" "${t[@]}" --resume "$ck2/step_00000002" --set train.seed=7
refuse "none.bin" "${t[@]}" --resume "$ck2/step_00000002" --set train.eval_every=2 --set "data.val_path=$tmp/none.bin"
refuse "none.bin" "${t[@]}" --start-over --set "data.path=$tmp/none.bin"
refuse "--start-over and --resume exclude each other" "${t[@]}" --start-over --resume "$ck2"
expect 0 '' "${t[@]}" --resume "$ck2" --steps 8
grep -q "resumed from $ck2 at step 6" "$ck2/train.log" ||
  { echo "FAIL: --resume ROOT after the refusals did not continue from step 6"; fail=1; }

if [ $fail -eq 0 ]; then echo "checkpoint_lifecycle: all checks passed"; fi
exit $fail
