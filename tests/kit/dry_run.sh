#!/usr/bin/env bash
# ctest kit.dry_run: `AUTOSP_KIT_DRY_RUN=1 bash .gpu-kit/run.sh` on this GPU-less machine walks
# every step that needs no GPU and ends with its table: every test filter of the kit matches a
# test, the CUDA tests skip (77) file by file, the GPU rows say "skipped (dry run)", the planned
# longest S of our Llama step (carried in the kit) is a number, and every step's log is in the
# output folder. Then the filter check must fail on a filter that matches nothing: the kit's
# sanitizer filter as it was before issue 30 (file tags without Catch2's -#). Skips (77) without a kit.
#   dry_run.sh SOURCE_DIR
set -uo pipefail
kit=${AUTOSP_KIT_DIR:-$1/.gpu-kit}
[ -x "$kit/run.sh" ] || { echo "no kit in $kit (run scripts/gpu-kit.sh): skipping"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
AUTOSP_KIT_DRY_RUN=1 AUTOSP_KIT_OUT="$out" AUTOSP_KIT_PYTHON=${AUTOSP_KIT_PYTHON:-/usr/bin/python3} \
  timeout 300 bash "$kit/run.sh" >"$out/stdout.txt" 2>&1
rc=$?
fail=0
expect() {  # expect PATTERN WHAT
  grep -qE "$1" "$out/stdout.txt" || { echo "FAILED: $2 (no line matching '$1')"; fail=1; }
}
[ $rc -eq 0 ] || { echo "FAILED: run.sh exited $rc"; fail=1; }
expect "^== autosp gpu kit .*DRY RUN" "the table's title"
expect "^GPU +skipped \(dry run\)" "the GPU row"
expect "^test filters +ok: sanitizer [1-9][0-9]* tests, cuDNN [1-9][0-9]*, [1-9][0-9]* test files" "every test filter matches"
expect "^CUDA tests +skipped \(dry run: exit 77 from each of [1-9][0-9]* test files" "the CUDA tests skip with 77, file by file"
expect "^compute-sanitizer +skipped \(dry run\)" "the sanitizer row"
expect "^attention .*skipped \(dry run; torch_attention.py --help exit 0\)" "the attention row"
expect "^Llama 1B step S=32k +skipped \(dry run\)" "the Llama row"
expect "^  longest S \(ours, planned\) +[0-9]+ in [0-9]+ GiB" "our longest S from the memory plan"
expect "^missing libraries +none" "no missing library"
expect "^total time" "the total"
for log in run.log cuda-tests.log versions.txt filters.log table.txt; do
  [ -s "$out/$log" ] || { echo "FAILED: no $log in the output folder"; fail=1; }
done
# A filter that matches nothing is an error, not "clean": the old sanitizer filter.
AUTOSP_KIT_OUT="$out/bad" AUTOSP_KIT_SANITIZER_TESTS="[#test_attention],[#test_norm]" \
  timeout 60 bash "$kit/run.sh" --check-filters >"$out/bad.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { echo "FAILED: --check-filters with a filter matching nothing exited $rc, expected 1"; fail=1; }
grep -qE "^test filters +ERROR: matching no test: sanitizer set" "$out/bad.txt" ||
  { echo "FAILED: no ERROR row naming the sanitizer filter:"; cat "$out/bad.txt"; fail=1; }
[ $fail -eq 0 ] || { echo "---- run.sh output:"; cat "$out/stdout.txt"; }
[ $fail -eq 0 ] && tail -14 "$out/stdout.txt"
exit $fail
