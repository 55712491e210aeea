#!/bin/bash
# In-process A/B of a CPU kernel file: the version at a git revision against the working tree's,
# linked into one driver under two namespaces and alternated call by call (scripts/kernel_ab/main.cpp).
#
#   scripts/kernel_ab.sh REV gemm ROUNDS [cold]     src/kernels/cpu/matmul.cpp at REV vs now (cold:
#                                                   every call's operands fresh from memory)
#   scripts/kernel_ab.sh REV attention ROUNDS S D   src/kernels/cpu/attention.cpp at REV vs now
#
# Both sides are built like the library (Release flags, OpenMP, OpenBLAS's OpenMP build) against the
# working tree's headers. Needs g++ and libopenblas-openmp-dev (scripts/setup.sh installs them).
set -euo pipefail
if [ $# -lt 3 ]; then sed -n 2,10p "$0" | sed 's/^# \{0,1\}//'; exit 2; fi
rev=$1 kind=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
case $kind in
  gemm) file=src/kernels/cpu/matmul.cpp ;;
  attention) file=src/kernels/cpu/attention.cpp ;;
  *) echo "error: kernel_ab: unknown kernel '$kind' (gemm or attention)" >&2; exit 2 ;;
esac
other=src/kernels/cpu/attention.cpp
[ "$kind" = attention ] && other=src/kernels/cpu/matmul.cpp
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" show "$rev:$file" > "$work/old.cpp" 2>/dev/null || { echo "error: kernel_ab: no $file at $rev" >&2; exit 2; }
blas=/usr/lib/x86_64-linux-gnu/openblas-openmp
flags="-std=c++20 -O3 -march=x86-64-v2 -Wno-psabi -fopenmp -I$root/src"
# Each side needs the other kernel file too (the wrapper references both): the working tree's.
g++ $flags -Dautosp=autosp_old -c "$work/old.cpp" -o "$work/old.o"
g++ $flags -Dautosp=autosp_old -c "$root/$other" -o "$work/old_other.o"
g++ $flags -Dautosp=autosp_old -DWRAPNAME=run_old -c "$root/scripts/kernel_ab/wrap.cpp" -o "$work/wrap_old.o"
g++ $flags -c "$root/$file" -o "$work/new.o"
g++ $flags -c "$root/$other" -o "$work/new_other.o"
g++ $flags -DWRAPNAME=run_new -c "$root/scripts/kernel_ab/wrap.cpp" -o "$work/wrap_new.o"
# The element conversions both kernel files may call (tensor/convert.cpp) and the AMX tiles that
# matmul.cpp's bf16 GEMM uses (kernels/cpu/amx_tiles.cpp), once per side.
for dep in src/tensor/convert.cpp src/kernels/cpu/amx_tiles.cpp; do
  g++ $flags -Dautosp=autosp_old -c "$root/$dep" -o "$work/old_$(basename "$dep" .cpp).o"
  g++ $flags -c "$root/$dep" -o "$work/new_$(basename "$dep" .cpp).o"
done
g++ $flags "$root/scripts/kernel_ab/main.cpp" "$work"/*.o -o "$work/kernel_ab" -L$blas -lopenblas
LD_LIBRARY_PATH=$blas OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$work/kernel_ab" "$kind" "$@"
