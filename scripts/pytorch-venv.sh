#!/usr/bin/env bash
# A current PyTorch (2.x from PyPI) in .venv-bench/ at the repository root, for the benchmarks only
# (autosp-bench --compare-pytorch, --mode attention); never for CI or the tests, which use Debian's
# python3-torch under /usr/bin/python3.
#   scripts/pytorch-venv.sh          create the venv once (plain `pip install torch`), then print its python
#   scripts/pytorch-venv.sh --check  print its python if it exists and imports torch; exit 1 otherwise
# PyPI's default torch wheel for Linux x86-64 is the CUDA build; it runs on the CPU as well (the CUDA
# libraries are installed but never loaded without a GPU). The venv is git-ignored.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$root/.venv-bench
py=$venv/bin/python

if "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "$py"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "error: no PyTorch venv at $venv (run scripts/pytorch-venv.sh to create it)" >&2
  exit 1
fi

# The first python3 on PATH that has the venv module (the Debian one may lack python3-venv).
base=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    base=$cand
    break
  fi
done
[ -n "$base" ] || { echo "error: no python3 with the venv and ensurepip modules" >&2; exit 1; }

echo "creating $venv with $("$base" --version) and torch from PyPI (once; a few GB)" >&2
"$base" -m venv "$venv"
"$py" -m pip install --quiet --upgrade pip >&2
"$py" -m pip install --quiet torch numpy >&2
"$py" -c 'import torch; print("torch", torch.__version__, "cuda build" if torch.version.cuda else "cpu build", file=__import__("sys").stderr)'
echo "$py"
