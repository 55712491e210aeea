#!/usr/bin/env bash
# scripts/longest_trainable.py on autosp-train with a small budget (384 MiB: a few thousand tokens of
# the tiny Llama with a large vocabulary, seconds a probe): the search ends on a bracket, a length that trained within the
# budget and one a step above it that did not, as the probes measured them (the kernel's peak
# resident set, or the memory cgroup's verdict where this machine lets the script make one); --probe
# shows runtime.tiled_loss fitting where the untiled step does not; bad flags give one `error:` line
# and exit code 2.
#   longest_trainable.sh BIN_DIR SOURCE_DIR
set -u
bin=$1
src=$2
script=$src/scripts/longest_trainable.py
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A 4096-token vocabulary makes the logits (and their gradient) dominate, so the limit comes at a
# few thousand tokens, where steps are quick, even for a CUDA build's ~140 MB of mapped libraries.
budget=0.375
if ! /usr/bin/python3 "$script" --impl autosp --bin "$bin" --config "$src/configs/llama-tiny.json" \
    --set model.vocab_size=4096 --budget-gib "$budget" --fit 2048,4096 --multiple 256 --margin 0.1 --threads 1 \
    --no-drop-caches --out "$tmp/probes.jsonl" >"$tmp/out" 2>"$tmp/err"; then
  echo "FAIL: longest_trainable.py exited non-zero: $(cat "$tmp/err")"
  fail=1
fi
if ! /usr/bin/python3 - "$tmp/out" "$budget" <<'EOF'; then
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
budget = int(float(sys.argv[2]) * 2**30)
probes, result = lines[:-1], lines[-1]
lo, hi = result["longest_fits"], result["shortest_fails"]
assert result["method"] in ("cgroup", "rss"), result
assert hi is not None and 4096 < lo < hi <= int(lo * 1.1) // 256 * 256 + 256, result
by_s = {p["S"]: p for p in probes}
assert by_s[lo]["fits"] and by_s[lo]["exit"] == 0, by_s[lo]
assert not by_s[hi]["fits"], by_s[hi]
if result["method"] == "rss":  # the verdict is the measured peak, whole process
    assert by_s[lo]["peak_rss_bytes"] <= budget, by_s[lo]
    assert by_s[hi]["exit"] != 0 or by_s[hi]["peak_rss_bytes"] > budget, by_s[hi]
else:  # the cgroup stopped the longer step, and the shorter one stayed within it
    assert by_s[hi]["exit"] != 0, by_s[hi]
    assert by_s[lo]["cgroup_peak_bytes"] is None or by_s[lo]["cgroup_peak_bytes"] <= budget, by_s[lo]
# the memory grows with S between the two --fit probes, as a training step's activations do
assert by_s[4096]["peak_rss_bytes"] > by_s[2048]["peak_rss_bytes"] and result["bytes_per_token"] > 1000, result
EOF
  echo "FAIL: search result: $(cat "$tmp/out")"
  fail=1
fi
if [ "$(wc -l <"$tmp/probes.jsonl")" -ne "$(($(wc -l <"$tmp/out") - 1))" ]; then
  echo "FAIL: --out holds $(wc -l <"$tmp/probes.jsonl") probes, stdout $(($(wc -l <"$tmp/out") - 1))"
  fail=1
fi

# --probe runs only the lengths given. At 16,384 tokens the untiled step's logits and their gradient
# alone (2 × 256 MiB) exceed the budget, and runtime.tiled_loss's chunk of them (64 MiB) does not.
for tiled in false true; do
  /usr/bin/python3 "$script" --impl autosp --bin "$bin" --config "$src/configs/llama-tiny.json" \
      --set model.vocab_size=4096 --set runtime.tiled_loss=$tiled --budget-gib "$budget" --probe 1024,16384 \
      --threads 1 --no-drop-caches >"$tmp/probe-$tiled" 2>"$tmp/err" || { echo "FAIL: --probe: $(cat "$tmp/err")"; fail=1; }
done
if ! /usr/bin/python3 - "$tmp/probe-false" "$tmp/probe-true" <<'EOF'; then
import json, sys
untiled, tiled = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert [p["S"] for p in untiled[:-1]] == [1024, 16384] and untiled[-1]["probed"] == [1024, 16384], untiled
assert untiled[-1]["fit"] == [1024] and tiled[-1]["fit"] == [1024, 16384], (untiled[-1], tiled[-1])
EOF
  echo "FAIL: --probe results: untiled $(cat "$tmp/probe-false"), tiled $(cat "$tmp/probe-true")"
  fail=1
fi

# --pairs: a DPO step (train.objective "dpo" on one pair a window) trains at a short length.
if ! /usr/bin/python3 "$script" --impl autosp --bin "$bin" --config "$src/configs/llama-tiny.json" --pairs \
    --budget-gib "$budget" --probe 1024 --threads 1 --no-drop-caches >"$tmp/probe-pairs" 2>"$tmp/err" ||
    ! grep -q '"fit": \[1024\]' "$tmp/probe-pairs"; then
  echo "FAIL: --pairs --probe 1024: $(cat "$tmp/probe-pairs" "$tmp/err")"
  fail=1
fi

. "$(dirname "$0")/lib/refusals.sh"
expect_usage_error() { refused_alone "$1" /usr/bin/python3 "$script" "${@:2}"; }  # expect_usage_error NEEDLE ARGS...
cfg=$src/configs/llama-tiny.json
expect_usage_error "budget-gib" --impl autosp --bin "$bin" --config "$cfg" --budget-gib 0
expect_usage_error "budget-gib" --impl autosp --bin "$bin" --config "$cfg" --budget-gib nan
expect_usage_error "margin" --impl autosp --bin "$bin" --config "$cfg" --budget-gib 1 --margin 1.5
expect_usage_error "grow" --impl autosp --bin "$bin" --config "$cfg" --budget-gib 1 --grow 1
expect_usage_error "--fit" --impl autosp --bin "$bin" --config "$cfg" --budget-gib 1 --fit 4096
expect_usage_error "--fit" --impl autosp --bin "$bin" --config "$cfg" --budget-gib 1 --fit 4096,1024
expect_usage_error "--fit" --impl autosp --bin "$bin" --config "$cfg" --budget-gib 1 --fit a,b
expect_usage_error "--probe" --impl autosp --bin "$bin" --config "$cfg" --budget-gib 1 --probe x
expect_usage_error "--probe" --impl autosp --bin "$bin" --config "$cfg" --budget-gib 1 --probe 1024,0
expect_usage_error "--from" --impl autosp --bin "$bin" --config "$cfg" --budget-gib 1 --from 0
expect_usage_error "--pairs" --impl pytorch --config "$cfg" --budget-gib 1 --pairs
expect_usage_error "no such file" --impl autosp --bin "$bin" --config "$tmp/none.json" --budget-gib 1
expect_usage_error "not found" --impl autosp --bin "$tmp" --config "$cfg" --budget-gib 1
expect_usage_error "not found" --impl pytorch --python "$tmp/python" --config "$cfg" --budget-gib 1
exit $fail
