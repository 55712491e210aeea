#!/usr/bin/env bash
# The README's first command, scripts/train.sh, as a user runs it (its setup and build steps find
# everything in place here), cut to 2 steps: 2 ranks train the default config, exit 0 and log the
# end of the run. Then a config that does not exist is exit 2 with an error line.
#   train_script.sh BIN_DIR SOURCE_DIR
set -u
src=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0
bash "$src/scripts/train.sh" configs/default.json --steps 2 >"$out" 2>&1
status=$?
if [ $status -ne 0 ] || ! grep -q "done: 2 steps" "$out"; then
  echo "FAIL scripts/train.sh configs/default.json --steps 2: exit $status"; tail -20 "$out"; fail=1
else
  echo "ok   scripts/train.sh trains the default config on 2 ranks: $(grep 'done:' "$out" | sed 's/.*done/done/')"
fi
bash "$src/scripts/train.sh" configs/no-such.json --steps 2 >"$out" 2>&1
status=$?
if [ $status -ne 2 ] || ! grep -q "^error: .*no-such.json" "$out"; then
  echo "FAIL scripts/train.sh with a missing config: exit $status, want 2 and an error line"; tail -5 "$out"; fail=1
else
  echo "ok   a missing config: exit 2, $(grep '^error:' "$out" | head -1)"
fi
exit $fail
