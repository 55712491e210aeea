#!/usr/bin/env bash
# The GPU kit's device script (built into .gpu-kit/run.sh by scripts/gpu-kit.sh; docs/gpu-kit.md).
# One call, at most 8 minutes (TOTAL_S = 460 s of steps), on a bare GPU machine with a CUDA toolkit
# and a Python venv holding torch, transformers and the cuDNN / NCCL wheels. Each step runs under
# its own timeout, its full log goes to ${AUTOSP_KIT_OUT:-kit-out}/, and the last lines are a
# short table:
#   1. environment: GPU, driver, glibc, CUDA, cuDNN, NCCL, torch, transformers; libraries the kit's
#      binaries cannot find; first a probe kernel, so a driver mismatch is an error, not "skipped";
#      then every test filter the steps below use must match a test (a filter that matches
#      nothing is an ERROR here, dry run included, never a "passed" or "clean" later);
#   2. the CUDA tests, one process per test file (a crash or a sticky CUDA error fails its file
#      only); cuDNN failures: the named cuDNN cases again with cuDNN's debug log;
#   3. compute-sanitizer memcheck and racecheck on a named, small set of tests, after a check that
#      the sanitizer supports this device (gVisor's GPUs do not: the row says so);
#   4. attention fwd+bwd, bf16, causal, D = 128, S = 4k…64k: ours and cuDNN through our API
#      (autosp-bench-attention), torch SDPA with its flash and cuDNN backends (torch_attention.py);
#   5. the ~1B Llama step at S = 32k: ours (autosp-bench) against HF LlamaForCausalLM with SDPA in
#      bf16 (hf_llama_step.py), tokens/s, MFU, peak memory, and the longest S each side fits (ours
#      planned by gpu-kit.sh before the lease, carried in longest-ours.json);
#   6. the table.
# The budget: steps 4 and 5 (the comparisons with PyTorch) keep their caps whatever happens before
# them: steps 1-3 may use only what is left of TOTAL_S beyond the sum of those caps (RESERVE_S).
# The kit's lib/ is on LD_LIBRARY_PATH for our binaries only (env in front of each), never for
# Python, PyTorch or compute-sanitizer themselves.
#   bash .gpu-kit/run.sh                      AUTOSP_KIT_PYTHON: the venv's python (default: python3)
#   AUTOSP_KIT_DRY_RUN=1 bash .gpu-kit/run.sh  (no GPU: walks what needs none, GPU rows "skipped")
#   bash .gpu-kit/run.sh --check-filters       (only the test filters of step 1; exit 1 if one matches nothing)
#   bash .gpu-kit/run.sh --unpack-only         (unpack lib.xz/ into lib/ and stop)
# Exit 0 when every step that ran passed, 1 otherwise.
set -uo pipefail
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The large libraries (OpenBLAS, gfortran, stdc++) travel xz-compressed (the kit's size cap):
# unpack them once, beside the other libraries.
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
CHECK_ONLY=""
[ "${1:-}" = "--check-filters" ] && CHECK_ONLY=1
OUT=${AUTOSP_KIT_OUT:-kit-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${AUTOSP_KIT_PYTHON:-python3}
START=$(date +%s)
TOTAL_S=${AUTOSP_KIT_BUDGET_S:-460}  # of the 480 the call may take: 20 s for the table and slack
PEAK=${PEAK_TFLOPS:-989}             # H200 dense bf16 TFLOP/s, for MFU
# The comparisons' caps (steps 4 and 5), kept for them: RESERVE_S is their sum.
CAP_ATT_OURS=60 CAP_ATT_TORCH=60 CAP_STEP_OURS=90 CAP_STEP_HF=110
RESERVE_S=$((CAP_ATT_OURS + CAP_ATT_TORCH + CAP_STEP_OURS + CAP_STEP_HF))
CAP_TEST_FILE=60  # one test file's process
# The named tests of steps 2 and 3 (Catch2 test specs: names, `*` wildcards, `,` for "or").
SANITIZER_TESTS=${AUTOSP_KIT_SANITIZER_TESTS:-"cuda sdpa bf16 (tensor cores where they apply) matches the CPU,cuda norm backwards match the CPU - cuda::bf16"}
CUDNN_TESTS=${AUTOSP_KIT_CUDNN_TESTS:-"cudnn sdpa bf16 matches the CPU"}
FAILED=0
ROWS=()
row() { ROWS+=("$(printf '%-30s %s' "$1" "$2")"); }
elapsed() { echo $(($(date +%s) - START)); }
budget() {  # budget CAP [RESERVE]: seconds a step may take, at most what is left of TOTAL_S beyond RESERVE
  local left=$((TOTAL_S - ${2:-0} - $(elapsed)))
  ((left < 5)) && left=5
  echo $(($1 < left ? $1 : left))
}
# step LOG CAP [RESERVE] -- CMD...: CMD under its timeout, stdout+stderr into $OUT/LOG; returns its exit code.
step() {
  local log=$1 cap
  if [ "$3" = "--" ]; then cap=$(budget "$2"); shift 3; else cap=$(budget "$2" "$3"); shift 4; fi
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
# The device's CUDA libraries (what our binaries and the version check load), and in front of them
# the kit's own for our binaries only: PyTorch and compute-sanitizer keep the machine's libstdc++.
DEVICE_LIBS="${CUDA_LIB}${WHEEL_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
DEVICE_LIBS=${DEVICE_LIBS#:}
OURS=(env "LD_LIBRARY_PATH=$KIT/lib${DEVICE_LIBS:+:$DEVICE_LIBS}")
echo "our binaries: ${OURS[*]}" >>"$OUT/run.log"

# The test filters of steps 2 and 3: each must match at least one test (Catch2 runs nothing and
# exits 0 on a filter that matches nothing, so a wrong one would read "passed" or "clean").
# Listing needs no GPU (tests/cuda/main.cpp), so the dry run checks them too.
TEST_FILES=$(cat "$KIT/cuda-test-files" 2>/dev/null)
matches() {  # matches SPEC_ARGS...: the number of tests the CUDA test binary lists for them
  # (Catch2's exit code is that number; a binary that refuses to list prints "no CUDA device")
  "${OURS[@]}" "$KIT/bin/autosp-cuda-tests" --list-test-names-only "$@" 2>>"$OUT/filters.log" |
    grep -vc -e '^$' -e '^no CUDA device'
}
check_filters() {
  local bad="" n f files=0
  n=$(matches "$SANITIZER_TESTS")
  echo "sanitizer: $n tests for '$SANITIZER_TESTS'" >>"$OUT/filters.log"
  [ "$n" -gt 0 ] || bad="$bad sanitizer set '$SANITIZER_TESTS';"
  local ns=$n
  n=$(matches "$CUDNN_TESTS")
  echo "cuDNN: $n tests for '$CUDNN_TESTS'" >>"$OUT/filters.log"
  [ "$n" -gt 0 ] || bad="$bad cuDNN set '$CUDNN_TESTS';"
  local nc=$n
  [ -n "$TEST_FILES" ] || bad="$bad no test files listed in cuda-test-files;"
  for f in $TEST_FILES; do
    n=$(matches -# "[#$f]")
    echo "file $f: $n tests" >>"$OUT/filters.log"
    if [ "$n" -gt 0 ]; then files=$((files + 1)); else bad="$bad file $f;"; fi
  done
  if [ -n "$bad" ]; then
    row "test filters" "ERROR: matching no test:$bad (filters.log)"
    return 1
  fi
  row "test filters" "ok: sanitizer $ns tests, cuDNN $nc, $files test files"
}
if [ -n "$CHECK_ONLY" ]; then
  check_filters
  rc=$?
  printf '%s\n' "${ROWS[@]}"
  exit $rc
fi

GLIBC=$(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')
MISSING=$(for b in "$KIT"/bin/*; do "${OURS[@]}" ldd "$b" 2>/dev/null | awk '/not found/ {print $1}'; done | sort -u | tr '\n' ' ')
# Versions of the libraries our binaries load, asked from the libraries themselves.
cat >"$OUT/versions.py" <<'PYEOF'
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
step versions.txt 40 "$RESERVE_S" -- env "LD_LIBRARY_PATH=$DEVICE_LIBS" "$PY" "$OUT/versions.py"
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
  step probe.log 30 "$RESERVE_S" -- "${OURS[@]}" "$KIT/bin/autosp-kit-probe"
  if [ $? -eq 0 ]; then
    GPU_OK=1
    row "GPU (probe kernel)" "$(sed -n 's/^probe: ok, //p' "$OUT/probe.log")"
  else
    FAILED=1
    row "GPU (probe kernel)" "ERROR: $(head -1 "$OUT/probe.log")"
  fi
  step nvidia-smi.log 20 "$RESERVE_S" -- nvidia-smi
  DRIVER=$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  row "driver" "${DRIVER:-unknown (nvidia-smi failed)}"
fi
GPU_MIB=$(timeout 20 nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
row "glibc / CUDA" "glibc $GLIBC (kit built on $(sed -n 's/.*glibc \([0-9.]*\).*/\1/p' "$KIT/BUILD-INFO" 2>/dev/null)), CUDA ${CUDA_V:-not found} (${CUDA_LIB:-no toolkit lib dir})"
row "cuDNN / NCCL" "cuDNN ${CUDNN_V:-?}, NCCL ${NCCL_V:-?}"
row "torch / transformers" "${TORCH_V:-?} / ${HF_V:-?}"
row "missing libraries" "${MISSING:-none}"
FILTERS_OK=1
check_filters || { FAILED=1; FILTERS_OK=""; }

# ---- 2. the CUDA tests, one process per test file ----------------------------------------------
tests_cmd=("${OURS[@]}" "$KIT/bin/autosp-cuda-tests" --warn NoTests)
passed=0 skipped=0 cut=0 failed_files=()
nfiles=$(echo $TEST_FILES | wc -w)
for f in $TEST_FILES; do
  if (($(budget "$CAP_TEST_FILE" "$RESERVE_S") <= 5)); then cut=$((cut + 1)); continue; fi
  step "cuda-$f.log" "$CAP_TEST_FILE" "$RESERVE_S" -- "${tests_cmd[@]}" -# "[#$f]" --durations yes
  rc=$?
  echo "$f: exit $rc" >>"$OUT/cuda-tests.log"
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
  elif [ $rc -eq 77 ]; then
    skipped=$((skipped + 1))
  elif timed_out $rc; then
    failed_files+=("$f (timed out)")
  else
    failed_files+=("$f (exit $rc: $(grep -E '^test cases:' "$OUT/cuda-$f.log" | tail -1))")
  fi
done
if [ -n "$DRY" ] && [ "$skipped" -eq "$nfiles" ] && [ "$nfiles" -gt 0 ]; then
  row "CUDA tests" "skipped (dry run: exit 77 from each of $nfiles test files, no CUDA device)"
elif [ "$skipped" -gt 0 ]; then
  FAILED=1
  row "CUDA tests" "ERROR: $skipped of $nfiles files skipped (77)${GPU_OK:+ although the probe ran}"
elif [ ${#failed_files[@]} -eq 0 ] && [ "$cut" -eq 0 ] && [ "$nfiles" -gt 0 ]; then
  row "CUDA tests" "passed: all $nfiles test files, one process each"
else
  FAILED=1
  row "CUDA tests" "FAILED: $passed of $nfiles files passed, ${#failed_files[@]} failed, $cut not run (budget)"
  for f in "${failed_files[@]}"; do row "  failed" "$f (cuda-${f%% *}.log)"; done
fi
if printf '%s\n' "${failed_files[@]}" | grep -q "^test_cudnn_attention"; then
  CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGINFO_DBG=1 CUDNN_LOGDEST_DBG="$OUT/cudnn-debug.log" \
    step cudnn-rerun.log 40 "$RESERVE_S" -- "${tests_cmd[@]}" "$CUDNN_TESTS"
  row "  cuDNN rerun" "exit $?, cuDNN log: cudnn-debug.log ($(wc -l <"$OUT/cudnn-debug.log" 2>/dev/null || echo 0) lines)"
fi

# ---- 3. compute-sanitizer ----------------------------------------------------------------------
if [ -z "$GPU_OK" ]; then
  row "compute-sanitizer" "skipped ($WHY)"
elif ! command -v compute-sanitizer >/dev/null 2>&1; then
  row "compute-sanitizer" "skipped (not installed)"
elif [ -z "$FILTERS_OK" ]; then
  row "compute-sanitizer" "skipped (its test filter is wrong: see the test filters row)"
elif (($(budget 30 "$RESERVE_S") <= 5)); then
  FAILED=1
  row "compute-sanitizer" "not run: no time left before the comparisons (the tests took it)"
else
  # On a device it does not support (gVisor's GPUs) it fails every program: try the probe first.
  step sanitizer-probe.log 30 "$RESERVE_S" -- compute-sanitizer --tool memcheck --target-processes all \
    "${OURS[@]}" "$KIT/bin/autosp-kit-probe"
  rc=$?
  if [ $rc -ne 0 ] || grep -qiE "not supported|error 999" "$OUT/sanitizer-probe.log"; then
    row "compute-sanitizer" "skipped (not supported on this device: exit $rc, $(grep -m1 -iE "not supported|error|fail" "$OUT/sanitizer-probe.log" | cut -c1-90))"
  else
    for tool in memcheck racecheck; do
      step "sanitizer-$tool.log" 45 "$RESERVE_S" -- compute-sanitizer --tool "$tool" --error-exitcode 99 \
        --target-processes all "${tests_cmd[@]}" "$SANITIZER_TESTS"
      rc=$?
      case $rc in
        0) row "sanitizer $tool" "clean ($(grep -E '^All tests passed' "$OUT/sanitizer-$tool.log" | head -1))" ;;
        99) FAILED=1; row "sanitizer $tool" "ERRORS: $(grep -m1 -E "ERROR|Invalid|hazard" "$OUT/sanitizer-$tool.log")" ;;
        124 | 137) row "sanitizer $tool" "timed out (partial log, no error before: $(grep -c ERROR "$OUT/sanitizer-$tool.log") errors)" ;;
        *) FAILED=1; row "sanitizer $tool" "exit $rc (tests failed or none ran under it; see log)" ;;
      esac
    done
  fi
fi

# ---- 4. attention ------------------------------------------------------------------------------
if [ -z "$GPU_OK" ]; then
  step torch-attention-help.log 30 -- "$PY" "$KIT/scripts/torch_attention.py" --help
  row "attention (ours, cuDNN, torch)" "skipped ($WHY; torch_attention.py --help exit $?)"
else
  step attention-ours.log "$CAP_ATT_OURS" $((CAP_ATT_TORCH + CAP_STEP_OURS + CAP_STEP_HF)) -- \
    "${OURS[@]}" stdbuf -oL "$KIT/bin/autosp-bench-attention"
  rc=$?
  [ $rc -eq 0 ] || FAILED=1
  step attention-torch.log "$CAP_ATT_TORCH" $((CAP_STEP_OURS + CAP_STEP_HF)) -- \
    "$PY" "$KIT/scripts/torch_attention.py" --max-seq 65536 --iters 3
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
# Planned before the lease (gpu-kit.sh) for the H200's memory: {"P": 1, "longest_seq": N, ...}.
LONGEST_OURS=$(grep -oE '"(longest_seq|seq_len|S)": *[0-9]+' "$KIT/longest-ours.json" 2>/dev/null | head -1 | grep -oE '[0-9]+$')
PLANNED_GIB=$(cat "$KIT/longest-ours.gib" 2>/dev/null)
LONGEST_NOTE="in ${PLANNED_GIB:-?} GiB"
if [ -n "$GPU_MIB" ] && [ -n "$PLANNED_GIB" ] && [ $((GPU_MIB / 1024)) -ne "$PLANNED_GIB" ]; then
  LONGEST_NOTE="$LONGEST_NOTE (planned for that; this GPU has $((GPU_MIB / 1024)) GiB)"
fi
if [ -z "$GPU_OK" ]; then
  row "Llama 1B step S=32k" "skipped ($WHY)"
  row "  longest S (ours, planned)" "${LONGEST_OURS:-missing (no longest-ours.json in the kit)} $LONGEST_NOTE"
  step hf-step-help.log 30 -- "$PY" "$KIT/scripts/hf_llama_step.py" --help
  row "  HF LlamaForCausalLM" "skipped (hf_llama_step.py --help exit $?)"
else
  step step-ours.log "$CAP_STEP_OURS" "$CAP_STEP_HF" -- "${OURS[@]}" "$KIT/bin/autosp-bench" --config "$CFG" \
    --mode step --warmup 1 --iters 2 --peak-tflops "$PEAK"
  rc=$?
  OURS_ROW=$("$PY" "$KIT/scripts/hf_llama_step.py" --summarize-ours "$OUT/step-ours.log")
  [ $rc -eq 0 ] || { FAILED=1; OURS_ROW="FAILED (exit $rc): $(grep -m1 "error" "$OUT/step-ours.log")"; }
  row "Llama 1B step S=32k, ours" "$OURS_ROW; longest S (planned) ${LONGEST_OURS:-?} $LONGEST_NOTE"
  step step-hf.log "$CAP_STEP_HF" -- "$PY" "$KIT/scripts/hf_llama_step.py" --config "$CFG" --warmup 1 --iters 2 \
    --peak-tflops "$PEAK" --longest
  rc=$?
  summary=$(grep "^summary: " "$OUT/step-hf.log" | tail -1 | sed 's/^summary: //')
  if [ $rc -eq 0 ]; then
    row "  HF LlamaForCausalLM (SDPA)" "$summary"
  elif timed_out $rc && [ -n "$summary" ]; then  # the step was measured; the longest-S search ran out of time
    row "  HF LlamaForCausalLM (SDPA)" "$summary; its longest-S search was cut by the step's timeout"
  else
    FAILED=1
    row "  HF LlamaForCausalLM (SDPA)" "FAILED (exit $rc) ${summary}"
  fi
fi

# ---- 6. the table ------------------------------------------------------------------------------
{
  echo
  echo "== autosp gpu kit — $(date -u '+%Y-%m-%d %H:%M UTC')${DRY:+ — DRY RUN (no GPU)}"
  for r in "${ROWS[@]}"; do echo "$r"; done
  printf '%-30s %s\n' "total time" "$(elapsed) s of $TOTAL_S (logs: $OUT)"
} | tee "$OUT/table.txt"
exit $FAILED
