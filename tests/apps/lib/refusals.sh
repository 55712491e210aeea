# Sourced by the app tests: checks that a command refuses its input as the binaries' contract says
# (exit code 2 and an `error:` line naming the problem; docs/DESIGN.md's exit codes). The sourcing
# script defines `tmp` (a scratch directory) and `fail` (set to 1 on a failure).

# refused NEEDLE COMMAND...: COMMAND exits 2 within 60 s and stderr has an `error:` line containing
# NEEDLE (a grep regex).
refused() {
  _refusal "$1" any "${@:2}"
}

# refused_alone NEEDLE COMMAND...: as refused, and that `error:` line is all stderr holds.
refused_alone() {
  _refusal "$1" alone "${@:2}"
}

_refusal() {
  local needle=$1 lines=$2
  shift 2
  timeout -k 5 60 "$@" >/dev/null 2>"$tmp/refusal_err" </dev/null
  local rc=$? why=""
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="did not end within 60 s"
  elif [ $rc -ne 2 ]; then why="exited $rc, expected 2"
  elif ! grep -q -- "^error: .*$needle" "$tmp/refusal_err"; then why="no 'error:' line naming '$needle'"
  elif [ $lines = alone ] && [ "$(wc -l <"$tmp/refusal_err")" -ne 1 ]; then why="stderr holds more than the error line"
  fi
  if [ -n "$why" ]; then
    echo "FAIL: $* $why; stderr: $(head -c 600 "$tmp/refusal_err")"
    fail=1
  else
    echo "ok: refused: $needle"
  fi
}
