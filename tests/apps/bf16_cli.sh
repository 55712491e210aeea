#!/usr/bin/env bash
# runtime.dtype "bfloat16" through the binaries: autosp-train accepts it on cpu (and says which
# path its matmuls take), trains, checkpoints f32 masters and resumes from them; 2 ranks with sequence parallelism 2
# run it too; autosp-graph shows the bf16 graph (casts after the f32 parameters, an f32 loss); a
# bogus dtype is still one `error:` line naming runtime.dtype with exit code 2.
#   bf16_cli.sh BIN_DIR SOURCE_DIR
set -u
bin=$1
src=$2
py=/usr/bin/python3
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

cat >"$tmp/cfg.json" <<JSON
{"model": {"arch": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
 "data": {"source": "synthetic", "seq_len": 32, "batch_size": 2},
 "train": {"steps": 4, "log_every": 1, "checkpoint_dir": "$tmp/ck"},
 "runtime": {"dtype": "bfloat16", "threads": 1}}
JSON

if ! "$bin/autosp-train" --config "$tmp/cfg.json" --metrics "$tmp/m.jsonl" 2>"$tmp/log"; then
  echo "FAIL: bf16 training run: $(tail -3 "$tmp/log")"
  fail=1
fi
# The log says which path the matmuls and the attention's products take: the CPU's bf16 units
# where /proc/cpuinfo lists them (AMX tiles first).
if grep -qw amx_bf16 /proc/cpuinfo && grep -qw amx_tile /proc/cpuinfo; then
  want="bf16 mixed precision.*matmuls, the tiled MLP and loss and the attention.s tile products on AMX"
elif grep -qw avx512_bf16 /proc/cpuinfo; then want="bf16 mixed precision.*attention.s tile products on AVX512-BF16"
else want="bf16 mixed precision.*emulated on cpu"; fi
grep -q "$want" "$tmp/log" || { echo "FAIL: no bf16 log line matching '$want'"; fail=1; }
if ! "$bin/autosp-train" --config "$tmp/cfg.json" --steps 6 --resume "$tmp/ck" --metrics "$tmp/m.jsonl" 2>"$tmp/log2"; then
  echo "FAIL: bf16 resume: $(tail -3 "$tmp/log2")"
  fail=1
fi
$py - "$src" "$tmp" <<'PY' || fail=1
import json, math, sys
sys.path.insert(0, sys.argv[1] + "/tests/ref")
import safetensors_io as st
tmp = sys.argv[2]
rows = [json.loads(l) for l in open(tmp + "/m.jsonl")]
assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6], rows
assert all(math.isfinite(r["loss"]) for r in rows), rows
for f in ("model", "optimizer"):
    tensors, _ = st.load(tmp + "/ck/step_00000006/" + f + ".safetensors")
    bad = [k for k, t in tensors.items() if str(t.dtype) != "torch.float32"]
    assert tensors and not bad, ("FAIL: checkpoint tensors not f32", f, bad)
PY

if ! mpirun --oversubscribe -np 2 "$bin/autosp-train" --config "$tmp/cfg.json" --set sequence_parallel.autosp_size=2 \
     --set "train.checkpoint_dir=$tmp/ck-sp2" --steps 2 --quiet 2>"$tmp/log3"; then
  echo "FAIL: 2-rank bf16 SP run: $(tail -3 "$tmp/log3")"
  fail=1
fi

out=$("$bin/autosp-graph" --config "$tmp/cfg.json" --set sequence_parallel.autosp_size=2 --world 2 --rank 1 --stage autosp 2>&1) || { echo "FAIL: autosp-graph: $out"; fail=1; }
for needle in 'cast(%model.embed_tokens.weight, dtype="bf16")' 'bf16[B, S//2, 32]' 'bf16[B, 2, S, 8]' \
              '%valid_tokens.global = all_reduce(%valid_tokens'; do
  grep -qF -- "$needle" <<<"$out" || { echo "FAIL: autosp-graph bf16 graph lacks '$needle'"; fail=1; }
done
grep -q '^%loss = .*f32\[\]' <<<"$out" || { echo "FAIL: the bf16 graph's loss is not f32"; fail=1; }

"$bin/autosp-train" --config "$tmp/cfg.json" --set runtime.dtype=bfloat17 >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -ne 2 ] || [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -q '^error: .*runtime.dtype' "$tmp/err"; then
  echo "FAIL: bogus dtype: exit $rc, stderr: $(cat "$tmp/err")"
  fail=1
fi

if [ $fail -eq 0 ]; then echo "bf16_cli: all checks passed"; fi
exit $fail
