#!/usr/bin/env bash
# autosp-plan: the layouts it prints are valid and run; --longest's answer trains within the memory
# it was given (autosp-train's measured peak, 2 MPI ranks, the tiny Llama at 8 layers), and that
# peak is what the search planned (within 2%); a memory nothing fits in gets the closest layout and
# by how much it misses (exit 1); bad flags give one `error:` line and exit code 2; "auto" layout
# keys are resolved at start-up to autosp-plan's choice.
#   plan_cli.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-plan
train=$1/autosp-train
src=$2
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cfg=$src/configs/llama-tiny.json

. "$(dirname "$0")/lib/refusals.sh"
expect_usage_error() { refused_alone "$1" "$bin" "${@:2}"; }  # expect_usage_error NEEDLE ARGS...

# Bad input.
ok=(--config "$cfg" --seq-len 1024 --ranks 4)
expect_usage_error "--ranks 0" --config "$cfg" --seq-len 1024 --ranks 0 --device cpu
expect_usage_error "--ranks -3" --config "$cfg" --seq-len 1024 --ranks -3 --device cpu
expect_usage_error "--ranks 'four'" --config "$cfg" --seq-len 1024 --ranks four --device cpu
expect_usage_error "--seq-len 0" --config "$cfg" --seq-len 0 --ranks 4 --device cpu
expect_usage_error "--seq-len -1" --config "$cfg" --seq-len -1 --ranks 4 --device cpu
expect_usage_error "--seq-len '1e9x'" --config "$cfg" --seq-len 1e9x --ranks 4 --device cpu
expect_usage_error "--seq-len 99999999999: expected 1..67108864 (data.seq_len's range)" \
  --config "$cfg" --seq-len 99999999999 --ranks 4 --device cpu
expect_usage_error "--ranks-per-node 3 does not divide --ranks 4" "${ok[@]}" --device H200 --ranks-per-node 3
mkfifo "$tmp/fifo"
refused_alone "fifo: a FIFO that nothing wrote to in 1 s" env AUTOSP_PIPE_TIMEOUT=1 "$bin" --config "$tmp/fifo" \
  --seq-len 1024 --ranks 4 --device cpu
expect_usage_error "known: H100-80GB, H200, A100-80GB" "${ok[@]}" --device TPU-v9
expect_usage_error "--memory 'lots'" "${ok[@]}" --memory lots
expect_usage_error "--memory '-5GB'" "${ok[@]}" --memory -5GB
expect_usage_error "--memory '80XB'" "${ok[@]}" --memory 80XB
expect_usage_error "--tflops 'nan'" "${ok[@]}" --device H200 --tflops nan
expect_usage_error "--inter-gbps '0'" "${ok[@]}" --device H200 --inter-gbps 0
expect_usage_error "--reserve '0.95'" "${ok[@]}" --device H200 --reserve 0.95
expect_usage_error "--ranks-per-node 0" "${ok[@]}" --device H200 --ranks-per-node 0
expect_usage_error "--global-batch 0" "${ok[@]}" --device H200 --global-batch 0
expect_usage_error "--top 0" "${ok[@]}" --device H200 --top 0
expect_usage_error "--format 'xml'" "${ok[@]}" --device H200 --format xml
expect_usage_error "--device or --memory is required" "${ok[@]}"
expect_usage_error "one of --seq-len S and --longest" "${ok[@]}" --device H200 --longest
expect_usage_error "one of --seq-len S and --longest" --config "$cfg" --ranks 4 --device H200
expect_usage_error "--ranks is required" --config "$cfg" --seq-len 1024 --device H200
expect_usage_error "--config is required" --seq-len 1024 --ranks 4 --device H200
expect_usage_error "--multiple 0" --config "$cfg" --longest --ranks 4 --device H200 --multiple 0
expect_usage_error "unknown key" --config "$cfg" --set model.nonsense=1 --seq-len 1024 --ranks 4 --device H200
head -c 300 /dev/urandom >"$tmp/random.json"
expect_usage_error "random.json" --config "$tmp/random.json" --seq-len 1024 --ranks 4 --device H200
expect_usage_error "max_position_embeddings" --config "$src/configs/gpt2-tiny.json" --seq-len 100000 --ranks 4 --device H200

# Nothing fits: exit 1, the closest layout and how far over it is.
"$bin" "${ok[@]}" --memory 1MB >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 1 ] || ! grep -q "nothing fits in 0.9 MB per rank: the closest is sp .* over" "$tmp/out"; then
  echo "FAIL: a memory nothing fits in: exit $rc, output: $(cat "$tmp/out" "$tmp/err")"
  fail=1
fi

# Every printed layout is valid: dp × sp = ranks, the ring divides sp, the heads (8, 4 KV) allow
# its Ulysses degree; fastest first; each fits; the global batch is micro-batch × accumulation × dp.
if ! "$bin" "${ok[@]}" --device H200 --global-batch 8 --top 10 --format json >"$tmp/h200.json" 2>"$tmp/err"; then
  echo "FAIL: autosp-plan on 4 H200s: $(cat "$tmp/err")"
  fail=1
fi
if ! python3 - "$tmp/h200.json" <<'EOF'; then
import json, sys
j = json.load(open(sys.argv[1]))
best = j["best"]
assert len(best) >= 3, best
for b in best:
    assert b["sp"] * b["dp"] == 4 and b["sp"] == b["ulysses"] * b["ring"], b
    u = b["ulysses"]
    assert 8 % u == 0 and (4 % u == 0 or u % 4 == 0), b
    assert b["micro_batch"] * b["accumulation"] * b["dp"] == 8, b
    assert b["peak_bytes"] <= j["usable_bytes"] and b["full_plan"], b
    assert f"sequence_parallel.autosp_size={b['sp']}" in b["set"] and "data.seq_len=1024" in b["set"], b
steps = [b["tokens_per_s"] for b in best]
assert steps == sorted(steps, reverse=True), steps
EOF
  echo "FAIL: the layouts on 4 H200s: $(cat "$tmp/h200.json")"
  fail=1
fi

# --write-config: the first layout as a whole config, which autosp-train reads back to the same
# layout; an unwritable path is a usage error.
"$bin" "${ok[@]}" --device cpu --top 1 --format json --write-config "$tmp/chosen.json" >"$tmp/cpu.json" 2>"$tmp/err"
if ! "$train" --config "$tmp/chosen.json" --print-config >"$tmp/printed.json" 2>"$tmp/err" ||
   ! python3 - "$tmp/cpu.json" "$tmp/printed.json" <<'EOF'; then
import json, sys
b = json.load(open(sys.argv[1]))["best"][0]
c = json.load(open(sys.argv[2]))
assert c["sequence_parallel"]["autosp_size"] == b["sp"] and c["sequence_parallel"]["ring_size"] == b["ring"], (b, c)
assert c["zero_optimization"]["stage"] == b["zero_stage"] and c["data"]["seq_len"] == 1024, (b, c)
assert c["runtime"]["activation_checkpointing"] == b["activation_checkpointing"], (b, c)
EOF
  echo "FAIL: --write-config's file does not hold the first layout: $(cat "$tmp/err")"
  fail=1
fi
expect_usage_error "--write-config $tmp/no/such/dir/x.json: cannot write" "${ok[@]}" --device cpu --write-config "$tmp/no/such/dir/x.json"

# --longest on this machine: 2 ranks, 32 MiB each, the tiny Llama at 8 layers. autosp-train runs
# the answer (its --set lines as printed) within the 32 MiB, and its measured peak is the planned one.
cap=33554432
set8=(--set model.num_hidden_layers=8 --set data.source=tokens --set data.path="$tmp/tokens.bin" --set data.batch_size=1)
/usr/bin/python3 - "$tmp/tokens.bin" <<'EOF'
import random, struct, sys
random.seed(1)
n = 100000
header = [0] * 256
header[0], header[1], header[2] = 20240520, 1, n
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *header) + struct.pack("<%dH" % n, *[random.randrange(256) for _ in range(n)]))
EOF
if ! "$bin" --config "$cfg" "${set8[@]}" --longest --ranks 2 --memory $cap --multiple 256 --top 1 --format json \
    >"$tmp/longest.json" 2>"$tmp/err"; then
  echo "FAIL: autosp-plan --longest: $(cat "$tmp/err")"
  fail=1
fi
mapfile -t sets < <(python3 -c "
import json, sys
for s in json.load(open(sys.argv[1]))['best'][0]['set']: print('--set'); print(s)" "$tmp/longest.json")
if ! mpirun --oversubscribe -np 2 "$train" --config "$cfg" "${sets[@]}" --steps 1 --metrics "$tmp/m.jsonl" --quiet \
    >"$tmp/train.out" 2>&1; then
  echo "FAIL: autosp-train on --longest's answer: $(tail -3 "$tmp/train.out")"
  fail=1
fi
if ! python3 - "$tmp/longest.json" "$tmp/m.jsonl" $cap <<'EOF'; then
import json, sys
j = json.load(open(sys.argv[1]))
measured = json.loads(open(sys.argv[2]).readline())["peak_bytes"]
cap, planned, S = int(sys.argv[3]), j["best"][0]["peak_bytes"], j["seq_len"]
print(f"longest S {S}: planned {planned:.0f}, measured {measured}, cap {cap}")
assert S >= 2048, S
assert measured <= cap, (measured, cap)
assert abs(measured - planned) <= 0.02 * measured, (measured, planned)
EOF
  echo "FAIL: --longest's answer against the run"
  fail=1
fi

# "auto" layout keys: autosp-train (2 ranks) resolves them with the same search and logs the choice,
# which is autosp-plan's first layout for that config; autosp-graph resolves them the same way.
autos=(--set sequence_parallel.autosp_size=auto --set sequence_parallel.ring_size=auto --set zero_optimization.stage=auto
       --set runtime.activation_checkpointing=auto --set runtime.tiled_mlp=auto --set runtime.tiled_loss=auto
       --set data.seq_len=512)
if ! mpirun --oversubscribe -np 2 "$train" --config "$cfg" "${autos[@]}" --steps 1 >"$tmp/auto.out" 2>&1; then
  echo "FAIL: autosp-train with \"auto\" keys: $(tail -3 "$tmp/auto.out")"
  fail=1
fi
want=$("$bin" --config "$cfg" "${autos[@]}" --seq-len 512 --ranks 2 --device cpu --top 1 --format json | python3 -c "
import json, sys
b = json.load(sys.stdin)['best'][0]
print(f\"sequence_parallel.autosp_size={b['sp']}, sequence_parallel.ring_size={b['ring']}, zero_optimization.stage={b['zero_stage']}\")")
if ! grep -qF "\"auto\" resolved for 2 ranks at data.seq_len 512: $want" "$tmp/auto.out"; then
  echo "FAIL: autosp-train's \"auto\" line is not autosp-plan's choice ($want): $(grep -F auto "$tmp/auto.out")"
  fail=1
fi
if ! "$1/autosp-graph" --config "$cfg" "${autos[@]}" --world 2 --plan-memory S=512 >/dev/null 2>"$tmp/err"; then
  echo "FAIL: autosp-graph with \"auto\" keys: $(cat "$tmp/err")"
  fail=1
fi

exit $fail
