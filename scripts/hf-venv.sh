#!/usr/bin/env bash
# Hugging Face transformers for the round-trip test (tests/ref/hf_roundtrip.py), in .venv-hf/ at the
# repository root: Debian's python3 with --system-site-packages, so it uses Debian's python3-torch
# (1.13), plus transformers 4.44, safetensors, jinja2 (chat templates) and tensorboard (its event
# reader, for tests/ref/tensorboard_events.py) from PyPI. Created once by scripts/test.sh; git-ignored.
#   scripts/hf-venv.sh          create the venv if missing, then print its python
#   scripts/hf-venv.sh --check  print its python if it imports transformers; exit 1 otherwise
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$root/.venv-hf
py=$venv/bin/python
probe='import torch, transformers, safetensors, jinja2; assert transformers.__version__.startswith("4.44.")'

if "$py" -c "$probe" >/dev/null 2>&1; then
  # A venv made before the TensorBoard test lacks only tensorboard: add it (its test skips without).
  if [ "${1:-}" != "--check" ] && ! "$py" -c "import tensorboard" >/dev/null 2>&1; then
    echo "adding tensorboard to $venv (the event files' reader)" >&2
    "$py" -m pip install --quiet tensorboard >&2
  fi
  echo "$py"
  exit 0
fi
# A venv made before chat templates (scripts/prepare_data.py --chat) lacks only jinja2: add it.
if [ "${1:-}" != "--check" ] && "$py" -c "${probe/, jinja2/}" >/dev/null 2>&1; then
  echo "adding jinja2 to $venv (chat templates)" >&2
  "$py" -m pip install --quiet "jinja2>=3.1" >&2
  "$py" -c "$probe"
  echo "$py"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "error: no transformers venv at $venv (run scripts/hf-venv.sh to create it)" >&2
  exit 1
fi
echo "creating $venv (Debian's python3 and torch, transformers 4.44 from PyPI; once)" >&2
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$py" -m pip install --quiet "transformers==4.44.*" safetensors "jinja2>=3.1" tensorboard >&2
"$py" -c "$probe"
echo "$py"
