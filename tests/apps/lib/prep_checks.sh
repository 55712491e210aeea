# Sourced by the scripts/prepare_data.py tests of tests/apps (prepare_data.sh, sft_data.sh,
# preference_data.sh; not a test itself: ctest runs apps/*.sh only). With `src` set to the source
# dir it finds the venv of scripts/hf-venv.sh (exit 77, skipped, without it), makes a temporary
# directory $tmp (removed on exit) and defines the two checkers, which count rows and set fail=1 on
# a failure:
#   check RC TEXT          ok when RC is 0 (the status first, so `check $? "... $(cmd)"` sees the
#                          row's, not cmd's)
#   row NEEDLE ARGS...     runs "${prep[@]}" ARGS...: ok when it exits 2 with one `error:` line
#                          containing NEEDLE (a grep pattern) and nothing else but progress lines
py=$(bash "$src/scripts/hf-venv.sh" --check 2>/dev/null) || { echo "skip: no $src/.venv-hf (scripts/hf-venv.sh)"; exit 77; }
prep=("$py" "$src/scripts/prepare_data.py")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore
fail=0
rows=0
check() {
  rows=$((rows + 1))
  if [ "$1" -ne 0 ]; then echo "FAIL [$rows] $2"; fail=1; else echo "ok   [$rows] $2"; fi
}
row() {  # row 'NEEDLE' ARGS...
  local needle=$1
  shift
  rows=$((rows + 1))
  timeout -k 5 60 "${prep[@]}" "$@" >"$tmp/out" 2>&1 </dev/null
  local rc=$?
  # Besides the one error: line, only the stage lines of prepare_data.py's progress (not on a
  # terminal: "STAGE: N UNIT" when a stage starts, "STAGE: N/M UNIT in M:SS (R UNIT/s)" when it ends).
  local other
  other=$(grep -v '^error: ' "$tmp/out" | grep -Ev '^[a-z][a-z ()-]*: [0-9]+(/[0-9]+)? [a-z]+( in [0-9:]+ \([0-9.]+ [a-z]+/s\))?$')
  if [ $rc -ne 2 ] || [ "$(grep -c '^error: ' "$tmp/out")" -ne 1 ] || [ -n "$other" ] ||
     ! grep -q "^error: .*$needle" "$tmp/out"; then
    echo "FAIL [$rows] $*: exit $rc, expected 2 and one line, 'error:' containing '$needle' (progress lines aside); output:"
    tail -3 "$tmp/out" | sed 's/^/    /'
    fail=1
  else
    echo "ok   [$rows] $(grep -m1 '^error:' "$tmp/out" | cut -c1-150)"
  fi
}
