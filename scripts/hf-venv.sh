#!/usr/bin/env bash
# Hugging Face transformers for the round-trip test (tests/ref/hf_roundtrip.py), in .venv-hf/ at the
# repository root: Debian's python3 with --system-site-packages, so it uses Debian's python3-torch
# (1.13), plus transformers 4.44, safetensors, jinja2 (chat templates), tensorboard (its event
# reader, for tests/ref/tensorboard_events.py) and PEFT 0.12 with accelerate 0.34 (the LoRA tests: the
# last releases that run on torch 1.13) from PyPI. Created once by scripts/test.sh; git-ignored.
#   scripts/hf-venv.sh          create the venv if missing, then print its python
#   scripts/hf-venv.sh --check  print its python if it imports transformers; exit 1 otherwise
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$root/.venv-hf
py=$venv/bin/python
probe='import torch, transformers, safetensors, jinja2, tensorboard, peft; assert transformers.__version__.startswith("4.44.")'
base_probe='import torch, transformers, safetensors; assert transformers.__version__.startswith("4.44.")'
# PEFT and accelerate without their dependencies: pip takes Debian's torch 1.13.0a0 for a pre-release
# below their torch>=1.13 and would download a torch 2.x; everything else they need is here already.
peft_pkgs=("peft==0.12.*" "accelerate==0.34.*")
add_extras() {  # what a venv made before chat templates, TensorBoard or LoRA lacks
  "$py" -m pip install --quiet "jinja2>=3.1" tensorboard >&2
  "$py" -m pip install --quiet --no-deps "${peft_pkgs[@]}" >&2
}

if "$py" -c "$probe" >/dev/null 2>&1; then
  echo "$py"
  exit 0
fi
if [ "${1:-}" != "--check" ] && "$py" -c "$base_probe" >/dev/null 2>&1; then
  echo "adding jinja2, tensorboard and PEFT to $venv (chat templates, event files, LoRA)" >&2
  add_extras
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
"$py" -m pip install --quiet "transformers==4.44.*" safetensors >&2
add_extras
"$py" -c "$probe"
echo "$py"
