#!/usr/bin/env bash
# The GPU kit's device script (built into .gpu-kit/run.sh by scripts/gpu-kit.sh; docs/gpu-kit.md).
# One call, at most 8 minutes, on a bare GPU machine with a CUDA toolkit and a Python venv holding
# torch, transformers and the cuDNN / NCCL wheels. Each step runs under its own timeout, its full
# log goes to ${AUTOSP_KIT_OUT:-kit-out}/, and the last lines are a short table:
#   1. environment: GPU, driver, glibc, CUDA, cuDNN, NCCL, torch, transformers; libraries the kit's
#      binaries cannot find; first a probe kernel, so a driver mismatch is an error, not "skipped";
#   2. every CUDA test in one process (cuDNN failures: rerun with cuDNN's debug log into the folder);
#   3. compute-sanitizer memcheck and racecheck on the attention and norm tests;
#   4. attention fwd+bwd, bf16, causal, D = 128, S = 4k…64k: ours and cuDNN through our API
#      (autosp-bench-attention), torch SDPA with its flash and cuDNN backends (torch_attention.py);
#   5. the ~1B Llama step at S = 32k: ours (autosp-bench) against HF LlamaForCausalLM with SDPA in
#      bf16 (hf_llama_step.py), tokens/s, MFU, peak memory, and the longest S each side fits;
#   6. the table.
#   bash .gpu-kit/run.sh                      AUTOSP_KIT_PYTHON: the venv's python (default: python3)
#   AUTOSP_KIT_DRY_RUN=1 bash .gpu-kit/run.sh  (no GPU: walks what needs none, GPU rows "skipped")
#   bash .gpu-kit/run.sh --unpack-only         (unpack lib.xz/ into lib/ and stop)
# Exit 0 when every step that ran passed, 1 otherwise.
set -uo pipefail
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# OpenBLAS travels xz-compressed (the kit's size cap): unpack it once, beside the other libraries.
unpack() {
  local z t
  for z in "$KIT"/lib.xz/*.xz; do
    [ -e "$z" ] || continue
    t="$KIT/lib/$(basename "${z%.xz}")"
    [ -s "$t" ] && continue
    if command -v xz >/dev/null 2>&1; then
      xz -dc "$z" >"$t.part" || return 1
    else
      "${PY:-python3}" -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$z" "$t.part" || return 1
    fi
    mv "$t.part" "$t"
  done
}
if [ "${1:-}" = "--unpack-only" ]; then
  unpack || { echo "kit: cannot unpack $KIT/lib.xz (no xz and no python3 with lzma)"; exit 1; }
  exit 0
fi

DRY=${AUTOSP_KIT_DRY_RUN:-0}
[ "$DRY" = 0 ] && DRY=""
OUT=${AUTOSP_KIT_OUT:-kit-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${AUTOSP_KIT_PYTHON:-python3}
START=$(date +%s)
TOTAL_S=${AUTOSP_KIT_BUDGET_S:-460}  # of the 480 the call may take: 20 s for the table and slack
PEAK=${PEAK_TFLOPS:-989}             # H200 dense bf16 TFLOP/s, for MFU
FAILED=0
ROWS=()
row() { ROWS+=("$(printf '%-30s %s' "$1" "$2")"); }
elapsed() { echo $(($(date +%s) - START)); }
budget() {  # budget CAP: seconds a step may take, at most what is left of TOTAL_S
  local left=$((TOTAL_S - $(elapsed)))
  ((left < 5)) && left=5
  echo $(($1 < left ? $1 : left))
}
# step LOG CAP CMD...: CMD under its timeout, stdout+stderr into $OUT/LOG; returns its exit code.
step() {
  local log=$1 cap
  cap=$(budget "$2")
  shift 2
  echo "== $log (timeout ${cap} s): $*" >>"$OUT/run.log"
  timeout --kill-after=5 "$cap" "$@" >"$OUT/$log" 2>&1
}
timed_out() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; }
echo "gpu kit: $(head -1 "$KIT/BUILD-INFO" 2>/dev/null); logs in $OUT" | tee "$OUT/run.log"

# ---- 1. environment --------------------------------------------------------------------------
unpack || row "kit libraries" "error: cannot unpack lib.xz/"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}
CUDA_LIB=""
for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib"; do
  if ls "$d"/libcudart.so* >/dev/null 2>&1; then CUDA_LIB=$d; break; fi
done
# The venv's wheels: site-packages/nvidia/<name>/lib (cudnn, nccl, cublas, ...).
SITE=$("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
WHEEL_LIBS=""
for s in $SITE; do
  for d in "$s"/nvidia/*/lib; do [ -d "$d" ] && WHEEL_LIBS="$WHEEL_LIBS:$d"; done
done
export LD_LIBRARY_PATH="$KIT/lib${CUDA_LIB:+:$CUDA_LIB}$WHEEL_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$OUT/run.log"

GLIBC=$(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')
MISSING=$(for b in "$KIT"/bin/*; do ldd "$b" 2>/dev/null | awk '/not found/ {print $1}'; done | sort -u | tr '\n' ' ')
# Versions of the libraries our binaries load, asked from the libraries themselves.
"$PY" - >"$OUT/versions.txt" 2>&1 <<'PYEOF'
import ctypes
def ver(lib, fn, fmt):
    try:
        h = ctypes.CDLL(lib)
    except OSError as e:
        return f"not found ({lib})"
    if fn == "ncclGetVersion":
        v = ctypes.c_int(); getattr(h, fn)(ctypes.byref(v)); v = v.value
    else:
        getattr(h, fn).restype = ctypes.c_size_t; v = getattr(h, fn)()
    return fmt(v)
print("cudnn:", ver("libcudnn.so.9", "cudnnGetVersion", lambda v: f"{v // 10000}.{v % 10000 // 100}.{v % 100}"))
print("nccl:", ver("libnccl.so.2", "ncclGetVersion", lambda v: f"{v // 10000}.{v % 10000 // 100}.{v % 100}"))
try:
    import torch
    print("torch:", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
except Exception as e:
    print("torch: not importable:", type(e).__name__, e)
try:
    import transformers
    print("transformers:", transformers.__version__)
except Exception as e:
    print("transformers: not importable:", type(e).__name__)
PYEOF
CUDNN_V=$(sed -n 's/^cudnn: //p' "$OUT/versions.txt")
NCCL_V=$(sed -n 's/^nccl: //p' "$OUT/versions.txt")
TORCH_V=$(sed -n 's/^torch: //p' "$OUT/versions.txt")
HF_V=$(sed -n 's/^transformers: //p' "$OUT/versions.txt")
CUDA_V=$( (command -v nvcc >/dev/null && nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') || ls "$CUDA_LIB" 2>/dev/null | sed -n 's/^libcudart.so.\([0-9.]*\)$/\1/p' | head -1)
GPU_OK=""
WHY="no working GPU"
[ -n "$DRY" ] && WHY="dry run"
if [ -n "$DRY" ]; then
  row "GPU" "skipped (dry run)"
else
  step probe.log 30 "$KIT/bin/autosp-kit-probe"
  if [ $? -eq 0 ]; then
    GPU_OK=1
    row "GPU (probe kernel)" "$(sed -n 's/^probe: ok, //p' "$OUT/probe.log")"
  else
    FAILED=1
    row "GPU (probe kernel)" "ERROR: $(head -1 "$OUT/probe.log")"
  fi
  step nvidia-smi.log 20 nvidia-smi
  DRIVER=$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  row "driver" "${DRIVER:-unknown (nvidia-smi failed)}"
fi
GPU_MIB=$(timeout 20 nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
row "glibc / CUDA" "glibc $GLIBC (kit built on $(sed -n 's/.*glibc \([0-9.]*\).*/\1/p' "$KIT/BUILD-INFO" 2>/dev/null)), CUDA ${CUDA_V:-not found} (${CUDA_LIB:-no toolkit lib dir})"
row "cuDNN / NCCL" "cuDNN ${CUDNN_V:-?}, NCCL ${NCCL_V:-?}"
row "torch / transformers" "${TORCH_V:-?} / ${HF_V:-?}"
row "missing libraries" "${MISSING:-none}"

# ---- 2. every CUDA test in one process ---------------------------------------------------------
step cuda-tests.log 150 "$KIT/bin/autosp-cuda-tests" --durations yes
rc=$?
summary=$(grep -E "^(All tests passed|test cases:)" "$OUT/cuda-tests.log" | tail -1)
if [ $rc -eq 0 ]; then
  row "CUDA tests" "passed: ${summary}"
elif [ $rc -eq 77 ]; then
  if [ -n "$DRY" ]; then row "CUDA tests" "skipped (dry run: exit 77, no CUDA device)"; else FAILED=1; row "CUDA tests" "ERROR: skipped (77) although the probe ran"; fi
else
  FAILED=1
  timed_out $rc && summary="timed out after $(budget 150) s"
  row "CUDA tests" "FAILED (exit $rc): ${summary}"
  failed_files=$(grep -oE "tests/cuda/test_[a-z_]+\.cpp" "$OUT/cuda-tests.log" | sort -u | tr '\n' ' ')
  row "  failing files" "${failed_files:-see cuda-tests.log}"
  if grep -q "test_cudnn_attention" "$OUT/cuda-tests.log"; then
    CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGINFO_DBG=1 CUDNN_LOGDEST_DBG="$OUT/cudnn-debug.log" \
      step cudnn-rerun.log 60 "$KIT/bin/autosp-cuda-tests" "[#test_cudnn_attention]"
    row "  cuDNN rerun" "exit $?, cuDNN log: cudnn-debug.log ($(wc -l <"$OUT/cudnn-debug.log" 2>/dev/null || echo 0) lines)"
  fi
fi

# ---- 3. compute-sanitizer ----------------------------------------------------------------------
if [ -z "$GPU_OK" ]; then
  row "compute-sanitizer" "skipped ($WHY)"
elif ! command -v compute-sanitizer >/dev/null 2>&1; then
  row "compute-sanitizer" "skipped (not installed)"
else
  for tool in memcheck racecheck; do
    step "sanitizer-$tool.log" 45 compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$KIT/bin/autosp-cuda-tests" "[#test_attention],[#test_norm]"
    rc=$?
    case $rc in
      0) row "sanitizer $tool" "clean (attention, norm tests)" ;;
      99) FAILED=1; row "sanitizer $tool" "ERRORS: $(grep -m1 -E "ERROR|Invalid|hazard" "$OUT/sanitizer-$tool.log")" ;;
      124 | 137) row "sanitizer $tool" "timed out (partial log, no error before: $(grep -c ERROR "$OUT/sanitizer-$tool.log") errors)" ;;
      *) FAILED=1; row "sanitizer $tool" "exit $rc (tests failed under it; see log)" ;;
    esac
  done
fi

# ---- 4. attention ------------------------------------------------------------------------------
if [ -z "$GPU_OK" ]; then
  step torch-attention-help.log 30 "$PY" "$KIT/scripts/torch_attention.py" --help
  row "attention (ours, cuDNN, torch)" "skipped ($WHY; torch_attention.py --help exit $?)"
else
  step attention-ours.log 80 stdbuf -oL "$KIT/bin/autosp-bench-attention"
  rc=$?
  [ $rc -eq 0 ] || FAILED=1
  step attention-torch.log 70 "$PY" "$KIT/scripts/torch_attention.py" --max-seq 65536 --iters 3
  rc2=$?
  [ $rc2 -eq 0 ] || FAILED=1
  row "attention fwd+bwd TFLOP/s" "ours exit $rc, torch exit $rc2 (bf16, causal, D 128, B 1)"
  # One line per S: ours, cuDNN through our API, torch flash, torch cuDNN.
  "$PY" "$KIT/scripts/torch_attention.py" --merge "$OUT/attention-ours.log" "$OUT/attention-torch.log" \
    >"$OUT/attention-table.txt" 2>>"$OUT/run.log"
  while IFS= read -r line; do ROWS+=("  $line"); done <"$OUT/attention-table.txt"
fi

# ---- 5. the ~1B Llama step at S = 32k ----------------------------------------------------------
CFG="$KIT/configs/llama-1b-32k.json"
budget_gib=$(( ${GPU_MIB:-143771} / 1024 ))
step longest-ours.log 60 "$PY" "$KIT/scripts/longest_sequence.py" --bin "$KIT/bin" --config "$CFG" \
  --budget-gib "$budget_gib" --ranks 1
LONGEST_OURS=$(grep -oE '"(longest_seq|seq_len|S)": *[0-9]+' "$OUT/longest-ours.log" | head -1 | grep -oE '[0-9]+$')
if [ -z "$GPU_OK" ]; then
  row "Llama 1B step S=32k" "skipped ($WHY)"
  row "  longest S (ours, planned)" "${LONGEST_OURS:-failed (see longest-ours.log)} in ${budget_gib} GiB"
  step hf-step-help.log 30 "$PY" "$KIT/scripts/hf_llama_step.py" --help
  row "  HF LlamaForCausalLM" "skipped (hf_llama_step.py --help exit $?)"
else
  step step-ours.log 110 "$KIT/bin/autosp-bench" --config "$CFG" --mode step --warmup 1 --iters 2 --peak-tflops "$PEAK"
  rc=$?
  OURS=$("$PY" "$KIT/scripts/hf_llama_step.py" --summarize-ours "$OUT/step-ours.log")
  [ $rc -eq 0 ] || { FAILED=1; OURS="FAILED (exit $rc): $(grep -m1 "error" "$OUT/step-ours.log")"; }
  row "Llama 1B step S=32k, ours" "$OURS; longest S (planned) ${LONGEST_OURS:-?}"
  step step-hf.log 120 "$PY" "$KIT/scripts/hf_llama_step.py" --config "$CFG" --warmup 1 --iters 2 \
    --peak-tflops "$PEAK" --longest
  rc=$?
  [ $rc -eq 0 ] || FAILED=1
  row "  HF LlamaForCausalLM (SDPA)" "$(grep "^summary: " "$OUT/step-hf.log" | tail -1 | sed 's/^summary: //') (exit $rc)"
fi

# ---- 6. the table ------------------------------------------------------------------------------
{
  echo
  echo "== autosp gpu kit — $(date -u '+%Y-%m-%d %H:%M UTC')${DRY:+ — DRY RUN (no GPU)}"
  for r in "${ROWS[@]}"; do echo "$r"; done
  printf '%-30s %s\n' "total time" "$(elapsed) s (logs: $OUT)"
} | tee "$OUT/table.txt"
exit $FAILED
