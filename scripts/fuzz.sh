#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang + ASan + UBSan) into build-fuzz/ and runs each for a
# fixed time from the committed seeds in fuzz/corpus/<target>/. New inputs the fuzzer finds stay in
# build-fuzz/corpus/; a crash is saved under build-fuzz/crashes/<target>/ and fails the run: add the
# input to fuzz/regressions/<target>/ (replayed by ctest) together with the fix.
#   scripts/fuzz.sh [SECONDS_PER_TARGET (default 20)] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(config safetensors tokens loss_mask)
cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)"
status=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  echo "fuzz: $t for ${seconds}s"
  # max_len: a token shard needs its 1 KiB header plus some tokens.
  if ! ASAN_OPTIONS=detect_leaks=1 "build-fuzz/${t}_fuzzer" "build-fuzz/corpus/$t" "fuzz/corpus/$t" \
      -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/crashes/$t/" >"build-fuzz/$t.log" 2>&1; then
    echo "fuzz: $t FAILED; the input is in build-fuzz/crashes/$t/:"
    grep -E "ERROR|SUMMARY|Test unit written|runtime error" "build-fuzz/$t.log" | head -20
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "build-fuzz/$t.log" | tr '\n' ' '
  echo
done
exit $status
