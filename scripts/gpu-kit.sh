#!/usr/bin/env bash
# Builds the GPU kit in .gpu-kit/ (git-ignored): everything the bare GPU machine needs to run our
# CUDA tests, benchmarks and trainer, which has no Debian packages, no MPI and no registry
# (docs/gpu-kit.md). Here, on the CPU machine:
#   - build-kit/: a Release build for sm_90a only (H100/H200), without MPI (so without NCCL), of
#     autosp-cuda-tests, autosp-bench-attention, autosp-bench, autosp-train and autosp-graph;
#   - .gpu-kit/bin: those binaries, stripped, and autosp-kit-probe (scripts/kit/probe.cu, one
#     trivial kernel, the CUDA runtime linked statically);
#   - .gpu-kit/lib: every shared library they load that is neither glibc nor CUDA's (spdlog, fmt,
#     OpenBLAS, gfortran, quadmath, gomp, stdc++, gcc_s); those of 1 MiB or more (OpenBLAS, 36 MiB
#     of every CPU's kernels; gfortran; stdc++) are kept xz-compressed in lib.xz and unpacked by
#     run.sh, which keeps the kit under 48 MiB;
#   - run.sh (scripts/kit/run.sh), the Python sides, configs and the check (scripts/kit/check.sh);
#   - what run.sh would otherwise compute on the GPU's time: cuda-test-files (the stems of
#     tests/cuda/test_*.cpp, one process each there) and longest-ours.json, the longest S of the
#     ~1B Llama that our memory plan fits in the H200's memory (longest_sequence.py over this
#     build's autosp-graph; KIT_GPU_MIB, 143771, as nvidia-smi reports the H200), with
#     longest-ours.gib, the GiB it was planned for.
# The driver, the CUDA runtime and cuBLAS come from the device's toolkit, cuDNN and NCCL from its
# pip wheels (site-packages/nvidia/*/lib) or the toolkit: run.sh finds them and prints versions.
#
#   scripts/gpu-kit.sh            KIT_BUILD_DIR (build-kit), KIT_CUDA_ARCH (90a), KIT_DIR (.gpu-kit),
#                                 KIT_JOBS (nproc), KIT_SKIP_BUILD=1 (stage from KIT_BUILD_DIR as built),
#                                 KIT_GPU_MIB (143771)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${KIT_BUILD_DIR:-build-kit}
ARCH=${KIT_CUDA_ARCH:-90a}
KIT=${KIT_DIR:-.gpu-kit}
MAX_MIB=${KIT_MAX_MIB:-48}
export PATH=/usr/local/cuda/bin:$PATH
NVCC=${CUDACXX:-$(command -v nvcc || true)}
[ -x "$NVCC" ] || { echo "error: nvcc not found (the kit's CUDA code is built here)" >&2; exit 2; }

BINARIES="autosp-cuda-tests autosp-bench-attention autosp-bench autosp-train autosp-graph"
# KIT_SKIP_BUILD=1 stages the kit from an existing build dir's binaries (KIT_BUILD_DIR) instead.
if [ -z "${KIT_SKIP_BUILD:-}" ]; then
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAUTOSP_WITH_CUDA=ON -DAUTOSP_WITH_MPI=OFF \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$BUILD.configure.log" 2>&1 ||
  { tail -20 "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j"${KIT_JOBS:-$(nproc)}" --target $BINARIES
fi

rm -rf "$KIT"
mkdir -p "$KIT/bin" "$KIT/lib" "$KIT/lib.xz" "$KIT/configs" "$KIT/scripts"
for b in $BINARIES; do
  cp "$BUILD/bin/$b" "$KIT/bin/"
  strip --strip-unneeded "$KIT/bin/$b"
done
"$NVCC" -O2 -arch="sm_${ARCH}" -cudart static -o "$KIT/bin/autosp-kit-probe" scripts/kit/probe.cu
strip --strip-unneeded "$KIT/bin/autosp-kit-probe"

# Every library a binary loads, except glibc's own, the loader and what the device provides.
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libutil|libresolv|libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc|libnvJitLink)\.so'
for b in "$KIT"/bin/*; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if ! [[ $name =~ $provided ]]; then cp -L "$path" "$KIT/lib/$name"; fi
done
# The large libraries (OpenBLAS carries every CPU's kernels: DYNAMIC_ARCH) compressed here,
# unpacked by run.sh.
for big in "$KIT"/lib/*; do
  [ "$(stat -c %s "$big")" -ge $((1 << 20)) ] || continue
  xz -T0 -6 -c "$big" >"$KIT/lib.xz/$(basename "$big").xz"
  rm "$big"
done

cp scripts/kit/run.sh scripts/kit/check.sh "$KIT/"
cp scripts/kit/*.py "$KIT/scripts/"
cp configs/llama-1b-32k.json configs/llama-tiny.json "$KIT/configs/" 2>/dev/null || cp configs/llama-1b-32k.json "$KIT/configs/"
# Computed here, not on the GPU's time (run.sh reads them).
for f in tests/cuda/test_*.cpp; do basename "$f" .cpp; done >"$KIT/cuda-test-files"
gib=$(( ${KIT_GPU_MIB:-143771} / 1024 ))
echo "$gib" >"$KIT/longest-ours.gib"
python3 scripts/longest_sequence.py --bin "$BUILD/bin" --config configs/llama-1b-32k.json --budget-gib "$gib" \
  --ranks 1 >"$KIT/longest-ours.json" ||
  { echo "error: longest_sequence.py failed planning the kit's longest S" >&2; exit 1; }
{
  echo "built $(date -u '+%Y-%m-%d %H:%M UTC') from $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
  built_arch="sm_$ARCH"
  [ -n "${KIT_SKIP_BUILD:-}" ] && built_arch="as built in $BUILD"
  echo "cuda arch $built_arch (probe sm_$ARCH), nvcc $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "binaries: $(cd "$KIT/bin" && echo *)"
  echo "bundled: $(cd "$KIT/lib" && echo *) $(cd "$KIT/lib.xz" && echo *)"
} >"$KIT/BUILD-INFO"

mib=$(du -sm "$KIT" | cut -f1)
echo "gpu-kit: $KIT, ${mib} MiB ($(du -sh "$KIT" | cut -f1))"
if [ "$mib" -gt "$MAX_MIB" ]; then
  du -sh "$KIT"/* "$KIT"/bin/* | sort -h | tail -8
  echo "error: the kit is ${mib} MiB, over its ${MAX_MIB} MiB" >&2
  exit 1
fi
