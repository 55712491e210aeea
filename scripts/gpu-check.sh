#!/usr/bin/env bash
# The one command for a GPU run: builds the CUDA backend, runs the gpu-labelled tests (every CUDA
# launcher against the CPU kernels, cuDNN SDPA, the NCCL communicator under mpirun), benchmarks our
# flash attention against cuDNN SDPA and prints a short table for docs/performance.md. Must finish
# in under 8 minutes on one H200; every step has its own timeout,
# and without a GPU it stops at once with an error (exit 1) instead of waiting.
#
#   scripts/gpu-check.sh            (build dir: build-gpu; BUILD_DIR=... to change it)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build-gpu}
START=$(date +%s)
LOG="$BUILD/gpu-check"  # full logs of each step stay here
mkdir -p "$LOG"

die() {
  echo "error: $*" >&2
  exit 1
}
elapsed() { echo $(($(date +%s) - START)); }
# Seconds a step may take: its own cap, or what is left of the 470 s the whole run may use.
budget() {
  local left=$((470 - $(elapsed)))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}

# ---- a GPU, or stop now ---------------------------------------------------------------------
command -v nvidia-smi >/dev/null 2>&1 || die "no CUDA device: nvidia-smi not found"
GPU=$(timeout 30 nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1) ||
  die "no CUDA device: nvidia-smi failed"
[ -n "$GPU" ] || die "no CUDA device: nvidia-smi lists none"
CAP=$(echo "$GPU" | awk -F', *' '{print $2}' | tr -d '.')
case "$CAP" in
  90) ARCH="90a" ;;  # sm_90a: the H100 / H200 build CI also compiles
  "") ARCH="80;90a" ;;
  *) ARCH="$CAP" ;;
esac
NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc) || die "nvcc not found (set CUDACXX)"
echo "== gpu-check: $GPU, CUDA arch $ARCH, $(date -u '+%Y-%m-%d %H:%M UTC')"

# ---- build ------------------------------------------------------------------------------------
echo "== build ($BUILD)"
timeout "$(budget 90)" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAUTOSP_WITH_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$LOG/configure.log" 2>&1 ||
  { tail -30 "$LOG/configure.log"; die "configure failed"; }
# autosp-nccl-test exists only in builds with NCCL (and MPI), autosp-gpu-sp-test in builds with MPI.
MPI_TESTS=$(ninja -C "$BUILD" -t targets all 2>/dev/null | grep -oE "^autosp-(nccl-test|gpu-sp-test)" | sort -u | tr '\n' ' ')
timeout "$(budget 270)" ninja -C "$BUILD" autosp autosp-cuda-tests autosp-bench-attention autosp-bench $MPI_TESTS >"$LOG/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$LOG/build.log" | head -40; die "build failed (or ran out of time)"; }
BUILD_S=$(elapsed)
echo "   built in ${BUILD_S} s"

# ---- gpu tests ---------------------------------------------------------------------------------
echo "== ctest -L gpu"
TESTS="failed"
if timeout "$(budget 150)" ctest --test-dir "$BUILD" -L gpu -j4 --output-on-failure --timeout 180 >"$LOG/ctest.log" 2>&1; then
  TESTS="passed"
fi
grep -E "tests passed|tests failed" "$LOG/ctest.log" | sed 's/^/   /'
# Multi-GPU cases (np 2, 4) skip on a one-GPU machine; all of them skipping means no device at all.
SKIPPED=$(grep -c "(Skipped)" "$LOG/ctest.log")
RAN=$(grep -cE "Test +#[0-9]+: " "$LOG/ctest.log")
if [ "$SKIPPED" -gt 0 ] && [ "$SKIPPED" -ge "$RAN" ]; then
  TESTS="skipped (the test binaries found no CUDA device)"
elif [ "$TESTS" = "passed" ] && [ "$SKIPPED" -gt 0 ]; then
  TESTS="passed ($SKIPPED skipped: $(grep "(Skipped)" "$LOG/ctest.log" | grep -oE "cuda\.[a-z_.0-9]+" | tr '\n' ' '))"
fi
if [ "${TESTS%% *}" = "failed" ]; then
  grep -E "^[0-9]+/[0-9]+ Test|^ *[0-9]+ - " "$LOG/ctest.log" | sed 's/^/   /'
  grep -B2 -A12 -E "FAILED:|REQUIRE|CHECK\(|error:" "$LOG/ctest.log" | head -150
fi

# ---- one training step of a ~1B Llama at S = 32k ------------------------------------------------
# Before the attention benchmark, which can use whatever time is left (its rows print as they finish).
# configs/llama-1b-32k.json: bf16 on CUDA, batch 1. MFU against the H200's dense bf16 peak (989 TF/s;
# PEAK_TFLOPS=... for another GPU). The row is autosp-bench's JSON (docs/performance.md columns).
echo "== Llama ~1B training step (S = 32k, bf16)"
STEP="failed"
if timeout "$(budget 150)" "$BUILD/bin/autosp-bench" --config configs/llama-1b-32k.json --mode step --warmup 1 --iters 2 \
  --peak-tflops "${PEAK_TFLOPS:-989}" >"$LOG/step.json" 2>"$LOG/step.err"; then
  STEP=$(tail -1 "$LOG/step.json" | sed -E 's/.*"mfu":([^,]*).*"peak_bytes":([0-9]+).*"step_ms":([^,]*).*"tflops":([^,]*).*"tokens_per_sec":([^,}]*).*/\5 tok\/s, \3 ms\/step, \4 TFLOP\/s, MFU \1, peak \2 B/')
else
  tail -5 "$LOG/step.err"
fi

# ---- attention benchmark ---------------------------------------------------------------------
echo "== attention benchmark"
BENCH="failed"
# stdbuf: rows reach the log as they finish, so a run cut short by the budget still shows them.
if timeout "$(budget 100)" stdbuf -oL "$BUILD/bin/autosp-bench-attention" >"$LOG/bench.txt" 2>"$LOG/bench.err"; then
  BENCH="ok"
else
  cat "$LOG/bench.err"
  [ -s "$LOG/bench.txt" ] && BENCH="partial (stopped: out of time or failed)"
fi

# ---- table -------------------------------------------------------------------------------------
echo
echo "== autosp gpu-check: $GPU — $(date -u '+%Y-%m-%d')"
printf '%-34s %s\n' "build (CUDA arch $ARCH)" "ok, ${BUILD_S} s"
printf '%-34s %s\n' "gpu tests (CUDA vs CPU kernels)" "$TESTS"
printf '%-34s %s\n' "attention benchmark" "$BENCH"
[ "$BENCH" != "failed" ] && sed 's/^/    /' "$LOG/bench.txt"
CUDNN_LINE="not run (benchmark failed)"
[ "$BENCH" = "ok" ] && CUDNN_LINE=$(sed -n 's/^cudnn-summary: //p' "$LOG/bench.txt")
printf '%-34s %s\n' "cuDNN SDPA fwd+bwd (same shapes)" "${CUDNN_LINE:-missing from the benchmark output}"
[ -s "$LOG/bench.err" ] && grep -i cudnn "$LOG/bench.err" | head -5 | sed 's/^/    /'
printf '%-34s %s\n' "Llama ~1B step, S = 32k, bf16" "$STEP"
printf '%-34s %s\n' "total time" "$(elapsed) s"
echo "(logs: $LOG)"

[ "${TESTS%% *}" = "passed" ] && [ "$BENCH" = "ok" ] && [ "$STEP" != "failed" ]
