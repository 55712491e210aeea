#!/usr/bin/env bash
# The GPU kit's self-containment check (run here by ctest kit.self_contained, and by run.sh's
# environment step on the device). Under `env -i` with only the kit's lib/ and the CUDA toolkit's
# lib folder on LD_LIBRARY_PATH:
#   - ldd of every kit binary resolves every library except the driver (libcuda), cuDNN and NCCL,
#     and each resolved one lies in the kit, the toolkit, or is glibc's own;
#   - each binary's CPU part runs: --help of the apps, a 2-step CPU training run on 2 thread ranks,
#     the CUDA tests exit 77 (skipped) and the attention benchmark says "no CUDA device"
#     (only where this machine has no GPU; with one they run for real in run.sh).
#   check.sh [KIT_DIR] [CUDA_LIB_DIR]     exit 0 all good, 1 with one "kit: ..." line per problem
set -uo pipefail
KIT=$(cd "${1:-$(dirname "$0")}" && pwd)
CUDA_LIB=${2:-${CUDA_LIB_DIR:-}}
if [ -z "$CUDA_LIB" ]; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcudart.so" ] || ls "$d"/libcudart.so.* >/dev/null 2>&1 && { CUDA_LIB=$d; break; }
  done
fi
bash "$KIT/run.sh" --unpack-only || exit 1
problems=0
problem() {
  echo "kit: $*"
  problems=$((problems + 1))
}
LIBS="$KIT/lib${CUDA_LIB:+:$CUDA_LIB}"
in_env() { env -i PATH=/usr/bin:/bin HOME="${HOME:-/tmp}" LD_LIBRARY_PATH="$LIBS" "$@"; }

may_miss='^(libcuda|libcudnn[a-z_]*|libnccl)\.so'
glibc='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv)\.so'
for b in "$KIT"/bin/*; do
  out=$(in_env ldd "$b" 2>&1) || { problem "$(basename "$b"): ldd failed: $out"; continue; }
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      [[ $name =~ $may_miss ]] || problem "$(basename "$b"): $name not found"
      continue
    fi
    case "$path" in
      "$KIT"/lib/*) ;;
      "$CUDA_LIB"/* | /usr/local/cuda*) ;;
      *) [[ $name =~ $glibc || $name =~ $may_miss ]] || problem "$(basename "$b"): $name from $path, outside the kit" ;;
    esac
  done <<<"$out"
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for app in autosp-train autosp-bench autosp-graph; do
  in_env "$KIT/bin/$app" --help >"$tmp/$app.help" 2>&1 || problem "$app --help failed: $(tail -2 "$tmp/$app.help")"
done
cat >"$tmp/tiny.json" <<'JSON'
{"model": {"arch": "llama", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 48},
 "data": {"source": "synthetic", "seq_len": 32, "batch_size": 2},
 "runtime": {"device": "cpu", "threads": 1}, "sequence_parallel": {"autosp_size": 2}}
JSON
if ! in_env "$KIT/bin/autosp-train" --config "$tmp/tiny.json" --steps 2 --thread-ranks 2 >"$tmp/train.log" 2>&1; then
  problem "autosp-train on 2 CPU thread ranks failed: $(tail -3 "$tmp/train.log")"
elif ! grep -q "done: 2 steps" "$tmp/train.log"; then
  problem "autosp-train on 2 CPU thread ranks did not report its 2 steps"
fi
in_env "$KIT/bin/autosp-graph" --config "$tmp/tiny.json" --world 2 --rank 1 --stage autosp >"$tmp/graph.txt" 2>&1 ||
  problem "autosp-graph failed: $(tail -2 "$tmp/graph.txt")"
if ! in_env "$KIT/bin/autosp-kit-probe" >"$tmp/probe.txt" 2>&1; then
  # No GPU here: the CPU part of the CUDA binaries is their refusal.
  grep -q "^error: " "$tmp/probe.txt" || problem "autosp-kit-probe failed without an error line: $(cat "$tmp/probe.txt")"
  in_env "$KIT/bin/autosp-cuda-tests" >"$tmp/cuda-tests.txt" 2>&1
  rc=$?
  [ $rc -eq 77 ] || problem "autosp-cuda-tests without a GPU exited $rc, expected 77 (skipped): $(tail -2 "$tmp/cuda-tests.txt")"
  in_env "$KIT/bin/autosp-bench-attention" >"$tmp/bench.txt" 2>&1
  grep -q "no CUDA device" "$tmp/bench.txt" || problem "autosp-bench-attention without a GPU: $(tail -2 "$tmp/bench.txt")"
fi
# As carried: without the libraries unpacked from lib.xz/.
unpacked=0
for z in "$KIT"/lib.xz/*.xz; do
  [ -e "$z" ] || continue
  f="$KIT/lib/$(basename "${z%.xz}")"
  [ -e "$f" ] && unpacked=$((unpacked + $(stat -c %s "$f")))
done
mib=$((($(du -sb "$KIT" | cut -f1) - unpacked) / 1048576))
max=${KIT_MAX_MIB:-48}
[ "$mib" -le "$max" ] || problem "the kit as carried is $mib MiB, over $max"
[ $problems -eq 0 ] && echo "kit: self-contained ($(ls "$KIT/bin" | wc -l) binaries, libs: $(ls "$KIT/lib" | tr '\n' ' '))"
exit $((problems > 0))
