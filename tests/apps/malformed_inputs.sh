#!/usr/bin/env bash
# Malformed inputs through the real autosp-train binary, one table row each: config files, --set,
# flags, environment, token shards, text, safetensors (--init-from) and checkpoint directories
# (--resume). Every row must exit 2 (bad input) within 20 s (no hang, no crash) with an
# `error:` line containing the row's text. Rows marked mpi run on 2 ranks: the job must end with
# exit code 2, and errors found before MPI starts must be reported by both ranks.
#   malformed_inputs.sh BIN_DIR SOURCE_DIR
set -u
bin=$1/autosp-train
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
unset AUTOSP_FAULT AUTOSP_COLLECTIVE_TIMEOUT
fail=0
rows=0

# ---- fixtures -----------------------------------------------------------------------------------
cat >"$tmp/cfg.json" <<'JSON'
{"model": {"arch": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
 "data": {"source": "synthetic", "seq_len": 16, "batch_size": 2},
 "train": {"steps": 2, "log_every": 1},
 "runtime": {"threads": 1}}
JSON
tokens=(--set data.source=tokens --set data.path=)  # data.path is appended per row
$py - "$tmp" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
def write(name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
def shard(magic=20240520, version=1, count=None, tokens=range(100), width="H"):
    tokens = list(tokens)
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = magic, version, len(tokens) if count is None else count
    return struct.pack("<256i", *hdr) + struct.pack("<%d%s" % (len(tokens), width), *tokens)
good = [t % 32 for t in range(100)]
write("good.bin", shard(tokens=good))
write("bad_magic.bin", shard(magic=12345, tokens=good))
write("bad_version.bin", shard(version=3, tokens=good))
write("truncated_header.bin", shard(tokens=good)[:100])
write("lying_count.bin", shard(count=2**31 - 1, tokens=good))
write("negative_count.bin", shard(count=-5, tokens=good))
write("odd_bytes.bin", shard(tokens=good) + b"\x01")
write("big_token.bin", shard(tokens=good[:50] + [31, 32] + good[:48]))
write("big_token_u32.bin", shard(magic=20240801, version=7, tokens=good[:10] + [70000] + good[:89], width="I"))
write("short.bin", shard(tokens=good[:10]))
write("empty.bin", b"")
write("empty.txt", b"")
write("short.txt", b"hello")

def st(header, data=b"", raw_len=None):
    h = json.dumps(header).encode() if isinstance(header, dict) else header
    return struct.pack("<Q", len(h) if raw_len is None else raw_len) + h + data
f32 = lambda n: struct.pack("<%df" % n, *([0.5] * n))
norm = lambda **kw: {"dtype": "F32", "shape": [32], "data_offsets": [0, 128], **kw}
write("garbage.safetensors", bytes((i * 97 + 13) % 256 for i in range(4000)))
write("tiny.safetensors", b"\x05\x00\x00")
write("huge_header.safetensors", st(b"{}", raw_len=2**63 + 5))
write("header_not_json.safetensors", st(b"{'model.norm.weight': 1}"))
write("deep.safetensors", st(b"[" * 500000 + b"]" * 500000))  # crashed the reader once (recursive dump)
write("beyond.safetensors", st({"model.norm.weight": norm(data_offsets=[0, 1 << 40])}, f32(32)))
write("dtype.safetensors", st({"model.norm.weight": norm(dtype="F13")}, f32(32)))
write("size_mismatch.safetensors", st({"model.norm.weight": norm(shape=[1000000, 1000000])}, f32(32)))
write("overlap.safetensors", st({"model.norm.weight": norm(), "x": norm(data_offsets=[64, 192])}, f32(48)))
write("wrong_name.safetensors", st({"transformer.wte.weight": norm()}, f32(32)))
write("missing.safetensors", st({"model.norm.weight": norm()}, f32(32)))
write("wrong_shape.safetensors", st({"model.norm.weight": norm(shape=[4, 8])}, f32(32)))
write("sinks_shape.safetensors", st({"model.layers.0.self_attn.sinks": norm(shape=[3], data_offsets=[0, 12])}, f32(3)))
write("int_dtype.safetensors", st({"model.norm.weight": norm(dtype="I32")}, f32(32)))
write("nan.safetensors", st({"model.norm.weight": norm()}, struct.pack("<32f", *([1.0] * 7 + [float("nan")] + [1.0] * 24))))
# Hugging Face directories and the files beside safetensors (model.from, --init-from)
write("pickle.bin", b"PK\x03\x04" + bytes(60))              # torch.save's zip format
write("pickle_legacy.bin", b"\x80\x02\x8a\x0a" + bytes(60))   # a protocol-2 pickle
write("escape.index.json", json.dumps({"weight_map": {"model.norm.weight": "../good.safetensors"}}).encode())
write("noshard.index.json", json.dumps({"weight_map": {"model.norm.weight": "absent.safetensors"}}).encode())
write("nomap.index.json", b'{"metadata": {}}')
write("a_config.json", b'{"model_type": "llama"}')
llama = {"model_type": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 48}  # cfg.json's model
def hfdir(name, config, files=()):
    os.makedirs(os.path.join(d, name), exist_ok=True)
    write(os.path.join(name, "config.json"), config if isinstance(config, bytes) else json.dumps(config).encode())
    for f in files:
        write(os.path.join(name, f), b"PK\x03\x04" + bytes(60))
hfdir("hf_garbled", b'{"model_type": ')
hfdir("hf_bert", {"model_type": "bert"})
hfdir("hf_unsupported", dict(llama, attention_bias="yes", sliding_window=4096, hidden_act="gelu"))
hfdir("hf_dynamic", dict(llama, rope_scaling={"rope_type": "dynamic", "factor": 4.0}))
hfdir("hf_yarn_factor", dict(llama, model_type="qwen2", rope_parameters={"rope_type": "yarn", "factor": 0.0, "rope_theta": 1e6}))
hfdir("hf_head_dim", dict(llama, model_type="qwen3", head_dim=7))
hfdir("hf_layer_types", dict(llama, model_type="qwen3", layer_types=["sliding_attention"]))
hfdir("hf_window", dict(llama, model_type="mistral", sliding_window=8, layer_types=["sliding_attention", "local"]))
hfdir("hf_unknown", dict(llama, n_experts=8))
hfdir("hf_dtypes", dict(llama, torch_dtype="float32", dtype="bfloat16"))
hfdir("hf_heads", dict(llama, num_attention_heads=8, num_key_value_heads=8))
hfdir("hf_pickle", llama, files=["pytorch_model.bin"])
hfdir("hf_noweights", llama)
write("hf_as_config.json", json.dumps(dict(llama, qkv_bias=True)).encode())
# The keys real files carry (issue 47), at values that change the math or are not values at all.
hfdir("hf_mrope", dict(llama, model_type="qwen2", use_mrope="yes"))
hfdir("hf_interleaved", dict(llama, rope_interleaved=1))
hfdir("hf_dca", dict(llama, model_type="qwen2", dual_chunk_attention_config=[1, 2]))
hfdir("hf_typo", dict(llama, rms_norm_epsilon=1e-5))
hfdir("hf_many", dict(llama, model_type="qwen2", use_mrope=True, rope_interleaved=True, n_expertz=3))
gptoss = dict(llama, model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2, head_dim=8)
hfdir("hf_gptoss_limit", dict(gptoss, swiglu_limit=0))
hfdir("hf_gptoss_quant", dict(gptoss, quantization_config={"quant_method": "gptq", "bits": 4}))
hfdir("hf_gptoss_topk", dict(gptoss, num_experts_per_tok=5))

# Loss masks (.npy, NumPy's format 1.0) beside good.bin (100 tokens).
def npy(descr, shape, data, version=1):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<H", len(h)) + h.encode() + data
write("good.npy", npy("|u1", "(100,)", bytes([1, 0] * 50)))
write("short_mask.npy", npy("|u1", "(99,)", bytes(99)))
write("f32_mask.npy", npy("<f4", "(100,)", bytes(400)))
write("2d_mask.npy", npy("|u1", "(10, 10)", bytes(100)))
write("lying_mask.npy", npy("|u1", "(100,)", bytes(50)))
write("value_mask.npy", npy("|u1", "(100,)", bytes([1, 7] * 50)))
write("zero_mask.npy", npy("|b1", "(100,)", bytes(100)))
write("v9_mask.npy", npy("|u1", "(100,)", bytes(100), version=9))
write("garbage_mask.npy", bytes((i * 31 + 7) % 256 for i in range(300)))
# Pair ids (train.objective "dpo") beside good.bin: pair 1's chosen sequence is 20 tokens, so the
# first window of 16 holds it alone (its rejected one is in the next window).
pairs = ([1] * 20 + [-1] * 10 + [2] * 30 + [-2] * 40)[:100]
write("good_pairs.npy", npy("<i4", "(100,)", struct.pack("<100i", *pairs)))
write("short_pairs.npy", npy("<i4", "(99,)", struct.pack("<99i", *pairs[:99])))
# A whole DPO split in dpo/ (six windows of 16, a pair each, 8 + 8 tokens), and garbage where
# dpo.precompute_ref keeps the reference's sums beside it.
os.mkdir(os.path.join(d, "dpo"))
write("dpo/train_000000.bin", shard(tokens=good))
write("dpo/train_000000.npy", npy("|u1", "(100,)", bytes([1] * 96 + [0] * 4)))
dpo_pairs = [(k // 16 + 1) * (1 if k % 16 < 8 else -1) for k in range(96)] + [0] * 4
write("dpo/pairs_train_000000.npy", npy("<i4", "(100,)", struct.pack("<100i", *dpo_pairs)))
write("dpo/ref_logps_train.safetensors", bytes((i * 17 + 3) % 256 for i in range(64)))
PY
mkfifo "$tmp/fifo" "$tmp/fifo.index.json"
mkdir -p "$tmp/hf_fifo" && mkfifo "$tmp/hf_fifo/config.json"
mkdir -p "$tmp/fifo_adapter" && mkfifo "$tmp/fifo_adapter/adapter_config.json"
mkdir -p "$tmp/adir" "$tmp/emptyckpt"
"$bin" --config "$tmp/cfg.json" --set "train.checkpoint_dir=$tmp/ck" --quiet 2>"$tmp/ck.log" ||
  { echo "FAIL: could not write the checkpoint the rows corrupt: $(tail -3 "$tmp/ck.log")"; exit 1; }
good_ck=$tmp/ck/step_00000002
ck() {  # ck NAME: a copy of the good checkpoint to corrupt
  cp -r "$good_ck" "$tmp/$1"
  echo "$tmp/$1"
}
flip() {  # flip FILE OFFSET: xor one byte with 0x10
  $py -c 'import sys; p, o = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, "rb").read()); b[o] ^= 0x10; open(p, "wb").write(b)' "$1" "$2"
}
edit_meta() {  # edit_meta DIR PYTHON-STATEMENT (on the dict m)
  $py -c 'import json, sys; p = sys.argv[1] + "/meta.json"; m = json.load(open(p)); exec(sys.argv[2]); json.dump(m, open(p, "w"))' "$1" "$2"
}
flipped=$(ck flipped) && flip "$flipped/model.safetensors" 2000
truncated=$(ck truncated) && truncate -s 500 "$truncated/optimizer.safetensors"
garbled=$(ck garbled) && echo '{"format": 2, "step": ' >"$garbled/meta.json"
nofiles=$(ck nofiles) && edit_meta "$nofiles" 'del m["files"]'
format1=$(ck format1) && edit_meta "$format1" 'm["format"] = 1'
badstep=$(ck badstep) && edit_meta "$badstep" 'm["step"] = -3'
nometa=$(ck nometa) && rm "$nometa/meta.json" && mkdir -p "$tmp/nometa_root" && mv "$nometa" "$tmp/nometa_root/step_00000002"
printf '{"model": {' >"$tmp/truncated.json"
: >"$tmp/empty.json"
echo '[1, 2]' >"$tmp/array.json"
$py -c 'print("{\"train\": {\"lr\": " + "[" * 500000 + "]" * 500000 + "}}")' >"$tmp/deep.json"
echo '{"modle": {}}' >"$tmp/unknown.json"
echo '{"model": {"hidden_size": "big"}}' >"$tmp/type.json"
echo '{"model": {"vocab_size": 99999999999}}' >"$tmp/range.json"
echo '{"model": {"hidden_size": 30, "num_attention_heads": 4}}' >"$tmp/divide.json"
echo '{"train": {"steps": 2}, "train": {"lr": 0.1}}' >"$tmp/dup_section.json"
echo '{"train": {"steps": 2, "steps": 3}}' >"$tmp/dup_key.json"
# DeepSpeed configs (--deepspeed), one broken key each
ds() { echo "$2" >"$tmp/ds_$1.json"; }
ds batch '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}'
ds fp16 '{"fp16": {"enabled": true}}'
ds offload '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}'
ds lamb '{"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}'
ds adam_l2 '{"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}}'
ds onecycle '{"scheduler": {"type": "OneCycle", "params": {}}}'
ds no_total '{"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5}}}'
ds warmup0 '{"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}'
ds passes '{"compile": {"deepcompile": true, "passes": ["z3"]}}'
ds unknown '{"train_micro_batch": 2}'
ds conflict '{"gradient_clipping": 0.5}'
ds auto_type '{"optimizer": {"type": "auto"}}'
ds bucket '{"zero_optimization": {"reduce_bucket_size": -5}}'
ds stage '{"zero_optimization": {"stage": 5}}'
ds sp '{"sequence_parallel_size": 3, "train_batch_size": 4}'
ds clip '{"gradient_clipping": "high"}'
ds bf16 '{"bf16": {"enabled": "yes"}}'
ds array '[1, 2]'
ds lowlr '{"optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}}'
ds batch_dp2 '{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}'
printf '{"bf16": ' >"$tmp/ds_truncated.json"
ds auto_cast '{"bf16": {"enabled": true, "auto_cast": "sometimes"}}'
ds sp_block '{"sequence_parallel": {"size": "x"}, "comms_config": 3}'
ds scale_typo '{"bf16": {"enabled": true, "loss_scal": 0}}'
ds many '{"fp16": {"enabled": true}, "zero_optimization": {"offload_optimizer": {"device": "nvme"}}, "sequence_parallel": [2]}'


# ---- the table ----------------------------------------------------------------------------------
# row [mpi] [env:VAR=VALUE]... 'NEEDLE' ARGS...   (ARGS follow the binary; NEEDLE is a grep regex)
row() {
  local mode=single
  local envs=()
  if [ "$1" = mpi ]; then mode=mpi && shift; fi
  while [[ $1 == env:* ]]; do envs+=("${1#env:}") && shift; done
  local needle=$1
  shift
  rows=$((rows + 1))
  local cmd=("$bin" "$@")
  [ $mode = mpi ] && cmd=(mpirun --oversubscribe -np 2 "$bin" "$@")
  timeout -k 5 20 env "${envs[@]}" "${cmd[@]}" >"$tmp/out" 2>&1 </dev/null
  local rc=$?
  local lines
  # An error block ("error: F: N problems:" and a line "  - ..." each) is read as one line.
  lines=$(awk '/^error: /{if (b != "") print b; b = $0; next} b != "" && /^  - /{b = b " | " substr($0, 5); next}
               {if (b != "") print b; b = ""; print} END {if (b != "") print b}' "$tmp/out" | grep -c "^error: .*$needle")
  local why=""
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="did not end within 20 s"
  elif [ $rc -ne 2 ]; then why="exit code $rc, expected 2"
  elif [ "$lines" -lt 1 ]; then why="no 'error:' line containing '$needle'"
  elif [ $mode = single ] && [ "$(grep -c '^error:' "$tmp/out")" -ne 1 ]; then why="more than one error line"
  fi
  if [ -n "$why" ]; then
    echo "FAIL [$rows] $*: $why; output:"
    head -5 "$tmp/out" | sed 's/^/    /'
    fail=1
  else
    echo "ok   [$rows] $(grep -m1 '^error:' "$tmp/out" | cut -c1-150)"
  fi
  last_lines=$lines
}
c=(--config "$tmp/cfg.json")

# config files
row 'truncated.json: not valid JSON' --config "$tmp/truncated.json"
row 'empty.json: not valid JSON' --config "$tmp/empty.json"
row 'top level' --config "$tmp/array.json"
row 'deep.json: JSON nested deeper than 32 levels' --config "$tmp/deep.json"
row "unknown key 'modle'" --config "$tmp/unknown.json"
row 'model.hidden_size = "big": expected an integer' --config "$tmp/type.json"
row 'model.vocab_size = 99999999999: expected an integer in \[2, 16777216\]' --config "$tmp/range.json"
row 'not divisible by model.num_attention_heads' --config "$tmp/divide.json"
# sequence_parallel.ring_size (ring attention)
row 'sequence_parallel.ring_size = 0: expected an integer in \[1, 65536\]' "${c[@]}" --set sequence_parallel.ring_size=0
row 'sequence_parallel.ring_size = "two": expected an integer or "auto"' "${c[@]}" --set sequence_parallel.ring_size=two
row 'sequence_parallel.ring_size = 2.5: expected an integer or "auto"' "${c[@]}" --set sequence_parallel.ring_size=2.5
row 'sequence_parallel.ring_size 2 does not divide sequence_parallel.autosp_size 1' "${c[@]}" --set sequence_parallel.ring_size=2
row 'sequence_parallel.ring_size 2 with autosp_size 4 leaves Ulysses 2 ranks for 6 query heads and 3 key/value heads' \
    "${c[@]}" --set sequence_parallel.autosp_size=4 --set sequence_parallel.ring_size=2 \
    --set model.num_attention_heads=6 --set model.num_key_value_heads=3 --set model.hidden_size=48
# lora (issue 43): the section's values, an adapter directory that is not one, --merge-lora's output
row 'lora.r = 0: expected an integer in \[1, 65536\]' "${c[@]}" --set lora.r=0
row "lora.target_modules: unknown module 'q_prj' (did you mean 'q_proj'?)" "${c[@]}" --set 'lora.target_modules=["q_prj"]'
row "lora.target_modules: 'c_fc' is a projection of gpt2, not of llama" "${c[@]}" --set 'lora.target_modules=["c_fc"]'
row 'lora.lora_dropout = 1: expected a value in \[0, 0.999999\]' "${c[@]}" --set lora.lora_dropout=1
row 'lora.lora_dropout = -0.1: expected a value in' "${c[@]}" --set lora.lora_dropout=-0.1
row 'lora.lora_dropout = "x": expected a number' "${c[@]}" --set lora.lora_dropout=x
row "lora.modules_to_save: 'lm_heads' names no module" "${c[@]}" --set 'lora.modules_to_save=["lm_heads"]'
row 'lora.from: .*adir/adapter_config.json: cannot open' "${c[@]}" --set lora.from="$tmp/adir"
mkdir -p "$tmp/bad_adapter" && echo '{"peft_type": "LORA", "r": 8, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}' \
  >"$tmp/bad_adapter/adapter_config.json" && echo garbage >"$tmp/bad_adapter/adapter_model.safetensors"
row 'bad_adapter/adapter_model.safetensors' "${c[@]}" --set lora.from="$tmp/bad_adapter"
row '--merge-lora needs a lora section' "${c[@]}" --merge-lora "$tmp/merged"
row "--merge-lora .*cfg.json: exists and is not an empty directory" "${c[@]}" --set lora.r=2 --merge-lora "$tmp/cfg.json"
row 'nope.json: cannot open (No such file or directory; expected a config file)' --config "$tmp/nope.json"
# A FIFO or pipe is read as its writer writes (bash's <(...)), each wait bounded: one with no writer is
# an error after AUTOSP_PIPE_TIMEOUT seconds (default 10), never a hang; a device is not a file.
row 'fifo: a FIFO that nothing wrote to in 10 s: no process writes to it' --config "$tmp/fifo"
row env:AUTOSP_PIPE_TIMEOUT=1 'fifo: a FIFO that nothing wrote to in 1 s' --config "$tmp/fifo"
row env:AUTOSP_PIPE_TIMEOUT=soon "AUTOSP_PIPE_TIMEOUT='soon': expected a number of seconds" --config "$tmp/fifo"
row '/dev/null: not a regular file (a character device); expected a config file' --config /dev/null
row '/dev/fd/[0-9]*: train.lr = -1: expected a value in' --config <(cat "$tmp/cfg.json") --set train.lr=-1
row env:AUTOSP_PIPE_TIMEOUT=1 'lora.from: .*fifo_adapter/adapter_config.json: a FIFO that nothing wrote to' \
  "${c[@]}" --set lora.from="$tmp/fifo_adapter"
row '\-\-set train.: expected section.key' "${c[@]}" --set train.=3
row 'adir: is a directory' --config "$tmp/adir"
row "dup_section.json: duplicate key 'train'" --config "$tmp/dup_section.json"
row "dup_key.json: duplicate key 'steps'" --config "$tmp/dup_key.json"
# --set
row "expected key.path=value" "${c[@]}" --set train.lr
row 'train.keep_checkpoints = -1' "${c[@]}" --set train.keep_checkpoints=-1
row 'runtime.threads = 1.5: expected an integer' "${c[@]}" --set runtime.threads=1.5
row 'runtime.grad_bucket_mb = 0' "${c[@]}" --set runtime.grad_bucket_mb=0
row 'train.gradient_accumulation_steps = 0' "${c[@]}" --set train.gradient_accumulation_steps=0
row 'train.gradient_accumulation_steps = 1.5: expected an integer' "${c[@]}" --set train.gradient_accumulation_steps=1.5
row 'runtime.peak_tflops = -1' "${c[@]}" --set runtime.peak_tflops=-1
row 'runtime.peak_tflops = "fast": expected a number' "${c[@]}" --set runtime.peak_tflops=fast
row 'runtime.overlap_grad_sync = "sometimes": expected true or false' "${c[@]}" --set runtime.overlap_grad_sync=sometimes
row 'runtime.tiled_mlp = "yes": expected true, false or "auto"' "${c[@]}" --set runtime.tiled_mlp=yes
row 'runtime.tiled_mlp = 3: expected true, false or "auto"' "${c[@]}" --set runtime.tiled_mlp=3
row 'runtime.tiled_mlp is for Llama' "${c[@]}" --set model.arch=gpt2 --set runtime.tiled_mlp=true
row 'runtime.tiled_loss = "yes": expected true, false or "auto"' "${c[@]}" --set runtime.tiled_loss=yes
row 'runtime.tiled_loss = 2: expected true, false or "auto"' "${c[@]}" --set runtime.tiled_loss=2
row 'zero_optimization.stage = 4: expected an integer in \[0, 3\]' "${c[@]}" --set zero_optimization.stage=4
row 'zero_optimization.stage = "automatic": expected an integer or "auto"' "${c[@]}" --set zero_optimization.stage=automatic
row 'sequence_parallel.autosp_size = "AUTO": expected an integer or "auto"' "${c[@]}" --set sequence_parallel.autosp_size=AUTO
row 'runtime.activation_checkpointing = "maybe": expected true, false or "auto"' "${c[@]}" --set runtime.activation_checkpointing=maybe
row 'model.arch: the value is not valid UTF-8' "${c[@]}" --set $'model.arch=\xff\xfe'
row 'expected section.key' "${c[@]}" --set train.lr.max=3
row "unknown key 'layers'" "${c[@]}" --set layers.99999999999=1  # was a 1.6 TB allocation (fuzzer find)
row 'data.path is required' "${c[@]}" --set data.source=tokens
row 'train.eps = 0: expected a value in \[1e-30, 1\]' "${c[@]}" --set train.eps=0
row 'train.save_timeout = 0: expected a value in' "${c[@]}" --set train.save_timeout=0
# flags and environment
row '--config is required'
row "--steps 'many': expected an integer" "${c[@]}" --steps many
row "bogus" "${c[@]}" --bogus
row "unexpected argument 'extra'" "${c[@]}" extra
row 'exclude each other' "${c[@]}" --resume "$good_ck" --init-from "$tmp/missing.safetensors"
row '\-\-start-over and \-\-resume exclude each other' "${c[@]}" --set "train.checkpoint_dir=$tmp/ck2" --start-over --resume "$good_ck"
row '\-\-start-over needs train.checkpoint_dir' "${c[@]}" --start-over
row '\-\-thread-ranks 0: expected 1..1024' "${c[@]}" --thread-ranks 0
row '\-\-thread-ranks 100000: expected 1..1024 (each rank is a thread of this process)' "${c[@]}" --thread-ranks 100000
row "\-\-thread-ranks 'two': expected an integer" "${c[@]}" --thread-ranks two
row 'autosp_size 2 does not divide the world size 3' "${c[@]}" --thread-ranks 3 --set sequence_parallel.autosp_size=2
row mpi '\-\-thread-ranks 2 under a launcher of 2 processes: each would run its own job' "${c[@]}" --thread-ranks 2
row env:AUTOSP_FAULT=rank:1,step:x,kind:exit "AUTOSP_FAULT='rank:1,step:x,kind:exit': step 'x'" "${c[@]}"
row env:AUTOSP_FAULT=rank:5,step:1,kind:exit 'AUTOSP_FAULT=.*rank 5 does not exist in a job of 1 rank' "${c[@]}"
row env:AUTOSP_COLLECTIVE_TIMEOUT=soon "AUTOSP_COLLECTIVE_TIMEOUT='soon'" "${c[@]}"
# token shards
row 'bad_magic.bin: bad magic 12345' "${c[@]}" "${tokens[@]}$tmp/bad_magic.bin"
row 'bad_version.bin: unsupported version 3' "${c[@]}" "${tokens[@]}$tmp/bad_version.bin"
row 'truncated_header.bin: truncated header' "${c[@]}" "${tokens[@]}$tmp/truncated_header.bin"
row 'lying_count.bin: token count mismatch: the header says 2147483647 tokens' "${c[@]}" "${tokens[@]}$tmp/lying_count.bin"
row 'negative_count.bin: token count mismatch' "${c[@]}" "${tokens[@]}$tmp/negative_count.bin"
row 'odd_bytes.bin: token count mismatch' "${c[@]}" "${tokens[@]}$tmp/odd_bytes.bin"
row 'big_token.bin: token 32 at index 51 is ≥ vocab_size 32' "${c[@]}" "${tokens[@]}$tmp/big_token.bin"
row 'big_token_u32.bin: token 70000 at index 10' "${c[@]}" "${tokens[@]}$tmp/big_token_u32.bin"
row 'short.bin: the token stream holds 10 tokens, fewer than seq_len' "${c[@]}" "${tokens[@]}$tmp/short.bin"
row 'empty.bin: empty file' "${c[@]}" "${tokens[@]}$tmp/empty.bin"
row 'no file matches the pattern' "${c[@]}" "${tokens[@]}$tmp/shards_*.bin"
row 'adir: not a regular file' "${c[@]}" "${tokens[@]}$tmp/adir"
row 'fifo: not a regular file' "${c[@]}" "${tokens[@]}$tmp/fifo"
# packed documents
row 'data.document_mask needs data.eos_token_id' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set data.document_mask=true
row 'data.eos_token_id 32 is outside the vocabulary' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set data.document_mask=true --set data.eos_token_id=32
row 'data.eos_token_id' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set data.document_mask=true --set data.eos_token_id=-1
row 'data.document_mask' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set data.document_mask=maybe --set data.eos_token_id=2
row 'the synthetic task has none' "${c[@]}" --set data.document_mask=true --set data.eos_token_id=2
row 'cannot apply the document mask' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set data.document_mask=true --set data.eos_token_id=2 --set runtime.device=cuda --set runtime.attention=cudnn
# validation data (data.val_path, train.eval_every)
row 'nothere.bin: cannot open' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set "data.val_path=$tmp/nothere.bin" --set train.eval_every=1
row 'bad_magic.bin: bad magic 12345' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set "data.val_path=$tmp/bad_magic.bin" --set train.eval_every=1
row 'big_token.bin: token 32 at index 51 is ≥ vocab_size 32' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set "data.val_path=$tmp/big_token.bin" --set train.eval_every=1
row 'train.eval_every 1 needs data.val_path' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set train.eval_every=1
row 'data.val_path does not apply to data.source "synthetic"' "${c[@]}" --set "data.val_path=$tmp/good.bin"
row 'train.eval_batches = 0' "${c[@]}" --set train.eval_batches=0
# DPO (issue 44): the objective and its section, pair-id files, a pair its window cuts
d=("${c[@]}" "${tokens[@]}$tmp/good.bin" --set train.objective=dpo --set "data.loss_mask_path=$tmp/good.npy")
p=(--set "data.pairs_path=$tmp/good_pairs.npy")
row 'train.objective = "ppo": expected one of lm|dpo' "${c[@]}" --set train.objective=ppo
row 'train.objective "dpo" needs data.pairs_path' "${d[@]}"
row 'train.objective "dpo" needs data.loss_mask_path' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set train.objective=dpo \
    --set "data.pairs_path=$tmp/good_pairs.npy"
row 'data.pairs_path and data.val_pairs_path are for train.objective "dpo"' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${p[@]}"
row 'dpo.beta 0 must be > 0' "${d[@]}" "${p[@]}" --set dpo.beta=0
row 'dpo.beta = -1: expected a value in \[0, 1e+06\]' "${d[@]}" "${p[@]}" --set dpo.beta=-1
row 'dpo.loss_type = "hinge": expected one of sigmoid|ipo' "${d[@]}" "${p[@]}" --set dpo.loss_type=hinge
row 'dpo.label_smoothing applies to dpo.loss_type "sigmoid"' "${d[@]}" "${p[@]}" --set dpo.loss_type=ipo --set dpo.label_smoothing=0.1
row 'dpo.precompute_ref = "yes": expected' "${d[@]}" "${p[@]}" --set dpo.precompute_ref=yes
row 'dpo/ref_logps_train.safetensors: ' "${c[@]}" "${tokens[@]}$tmp/dpo/train_*.bin" --set train.objective=dpo \
    --set "data.loss_mask_path=$tmp/dpo/train_*.npy" --set "data.pairs_path=$tmp/dpo/pairs_train_*.npy" \
    --set dpo.precompute_ref=true
row 'train.objective "dpo" with data.val_path needs data.val_pairs_path' "${d[@]}" "${p[@]}" \
    --set "data.val_path=$tmp/good.bin" --set "data.val_loss_mask_path=$tmp/good.npy"
row 'train.objective "dpo" with data.val_path needs data.val_loss_mask_path' "${d[@]}" "${p[@]}" \
    --set "data.val_path=$tmp/good.bin" --set "data.val_pairs_path=$tmp/good_pairs.npy"
row 'data.val_pairs_path needs data.val_path' "${d[@]}" "${p[@]}" --set "data.val_pairs_path=$tmp/good_pairs.npy"
row "good.npy: dtype '|u1': pair ids are little-endian int32" "${d[@]}" --set "data.pairs_path=$tmp/good.npy"
row 'short_pairs.npy: the pair-id file holds 99 values but its token file .*good.bin holds 100 tokens' "${d[@]}" \
    --set "data.pairs_path=$tmp/short_pairs.npy"
row 'pair id 1 in sequence 0 of the batch has completion targets on its chosen side only' "${d[@]}" "${p[@]}"
# loss masks (issue 27): the keys, then each malformed .npy named with its token file
m=(--set "data.loss_mask_path=$tmp")  # the mask file is appended per row
row 'data.loss_mask_path and data.val_loss_mask_path do not apply to data.source "synthetic"' "${c[@]}" --set "data.loss_mask_path=$tmp/good.npy"
row 'data.val_loss_mask_path needs data.val_path' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set "data.val_loss_mask_path=$tmp/good.npy"
row 'nomask_\*.npy: no file matches the pattern' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/nomask_*.npy"
row 'short_mask.npy: the loss mask holds 99 values but its token file .*good.bin holds 100 tokens' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/short_mask.npy"
row "f32_mask.npy: dtype '<f4': a loss mask is uint8 .*(the loss mask of .*good.bin)" "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/f32_mask.npy"
row '2d_mask.npy: shape (10, 10): a loss mask has one dimension' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/2d_mask.npy"
row 'lying_mask.npy: shape (100,) but the file holds 50 bytes' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/lying_mask.npy"
row 'value_mask.npy: value 7 at index 1 of a loss mask is not 0 or 1' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/value_mask.npy"
row 'v9_mask.npy: unsupported .npy version 9.0' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/v9_mask.npy"
row 'garbage_mask.npy: not a .npy file' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/garbage_mask.npy"
row 'good.bin: not a .npy file' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/good.bin"
row "$tmp/\*_mask.npy: 8 loss masks for the 1 token file of" "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/*_mask.npy"
row 'short_mask.npy: the loss mask holds 99 values' "${c[@]}" "${tokens[@]}$tmp/good.bin" --set "data.val_path=$tmp/good.bin" --set "data.val_loss_mask_path=$tmp/short_mask.npy" --set train.eval_every=1
row mpi 'short_mask.npy: the loss mask holds 99 values' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${m[@]}/short_mask.npy"
# document ids (decision 181): an id file of the wrong dtype or length, and the keys where they do not apply
dm=(--set data.document_mask=true --set data.eos_token_id=0)
row "good.npy: dtype '|u1': document ids are little-endian int32 .*(the document ids of .*good.bin)" "${c[@]}" "${tokens[@]}$tmp/good.bin" "${dm[@]}" --set "data.doc_ids_path=$tmp/good.npy"
row 'short_pairs.npy: the document-id file holds 99 values but its token file .*good.bin holds 100 tokens' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${dm[@]}" --set "data.doc_ids_path=$tmp/short_pairs.npy"
row 'data.val_doc_ids_path needs data.val_path' "${c[@]}" "${tokens[@]}$tmp/good.bin" "${dm[@]}" --set "data.val_doc_ids_path=$tmp/short_pairs.npy"
row 'data.doc_ids_path applies to data.source "tokens"' "${c[@]}" --set "data.doc_ids_path=$tmp/short_pairs.npy"
# data.shuffle, data.seed, data.mix (issue 26): the keys, then every path of a mix read like data.path
# A list holds commas, which --set (cxxopts) splits at: the mixes go into config files.
mixcfg() {  # mixcfg 'MIX JSON' [SOURCE]: a config file of cfg.json with data.mix and data.source; prints its path
  local f
  f=$(mktemp "$tmp/mix_XXXX.json")
  $py - "$tmp/cfg.json" "$f" "$1" "${2:-tokens}" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["data"].update({"mix": json.loads(sys.argv[3]), "source": sys.argv[4]})
json.dump(cfg, open(sys.argv[2], "w"))
PY
  echo "$f"
}
mix() {  # mix PATH:WEIGHT...: the data.mix JSON
  local list="" e
  for e in "$@"; do list+="${list:+, }{\"path\": \"${e%:*}\", \"weight\": ${e##*:}}"; done
  echo "[$list]"
}
row 'data.shuffle = "maybe": expected true or false' "${c[@]}" --set data.shuffle=maybe
row 'data.shuffle = 1: expected true or false' "${c[@]}" --set data.shuffle=1
row 'data.seed = -5: expected an integer in \[-1, ' "${c[@]}" --set data.seed=-5
row 'data.seed = 1.5: expected an integer' "${c[@]}" --set data.seed=1.5
row 'data.mix = "a.bin": expected a list or null' "${c[@]}" --set data.source=tokens --set data.mix=a.bin
row 'data.mix = {}: expected a list or null' "${c[@]}" --set data.source=tokens --set 'data.mix={}'
row 'data.mix\[0\] = 1: expected {"path"' "${c[@]}" --set data.source=tokens --set 'data.mix=[1]'
row 'data.mix\[1\].path: expected' --config "$(mixcfg "[{\"path\": \"$tmp/good.bin\"}, {\"weight\": 2}]")"
row 'data.mix\[0\].path: expected' "${c[@]}" --set data.source=tokens --set 'data.mix=[{"path": ""}]'
row 'data.mix\[0\].path: expected' "${c[@]}" --set data.source=tokens --set 'data.mix=[{"path": 7}]'
row 'data.mix\[0\].weight = -1: expected a number in (0, 1e12\]' --config "$(mixcfg "$(mix "$tmp/good.bin:-1")" tokens)"
row 'data.mix\[0\].weight = 0: expected' --config "$(mixcfg "$(mix "$tmp/good.bin:0")" tokens)"
row 'data.mix\[0\].weight = "heavy": expected' --config "$(mixcfg "$(mix "$tmp/good.bin:\"heavy\"")" tokens)"
row 'data.mix\[0\].weight = 1.*: expected a number in (0, 1e12\]' --config "$(mixcfg "$(mix "$tmp/good.bin:1e13")" tokens)"
row "data.mix\\[0\\]: unknown key 'weights'" --config "$(mixcfg "[{\"path\": \"$tmp/good.bin\", \"weights\": 1}]")"
row 'data.mix\[0\].loss_mask_path = 5: expected a file or a glob' --config "$(mixcfg "[{\"path\": \"$tmp/good.bin\", \"loss_mask_path\": 5}]")"
row 'short_mask.npy: the loss mask holds 99 values' --config "$(mixcfg "[{\"path\": \"$tmp/good.bin\", \"loss_mask_path\": \"$tmp/short_mask.npy\"}]")"
row 'data.path and data.mix exclude each other' --config "$(mixcfg "$(mix "$tmp/good.bin:1")" tokens)" "${tokens[@]}$tmp/good.bin"
row 'data.mix does not apply to data.source "synthetic"' --config "$(mixcfg "$(mix "$tmp/good.bin:1")" synthetic)"
row 'data.mix\[1\].weight = 1e-09: .*less than one sequence in 10000' --config "$(mixcfg "$(mix "$tmp/good.bin:1" "$tmp/good.bin:1e-9")" tokens)"
row 'bad_magic.bin: bad magic 12345' --config "$(mixcfg "$(mix "$tmp/good.bin:1" "$tmp/bad_magic.bin:1")" tokens)"
row 'lying_count.bin: token count mismatch' --config "$(mixcfg "$(mix "$tmp/lying_count.bin:1" "$tmp/good.bin:1")" tokens)"
row 'big_token.bin: token 32 at index 51 is ≥ vocab_size 32' --config "$(mixcfg "$(mix "$tmp/good.bin:1" "$tmp/big_token.bin:1000")" tokens)"
row 'short.bin: the token stream holds 10 tokens, fewer than seq_len + 1 = 17' --config "$(mixcfg "$(mix "$tmp/good.bin:1" "$tmp/short.bin:1")" tokens)"
row 'nothere_\*.bin: no file matches' --config "$(mixcfg "$(mix "$tmp/good.bin:1" "$tmp/nothere_*.bin:1")" tokens)"
row 'empty.txt: empty file' --config "$(mixcfg "$(mix "$tmp/empty.txt:1" "$tmp/short.txt:1")" text)" --set model.vocab_size=256
row mpi 'bad_magic.bin: bad magic 12345' --config "$(mixcfg "$(mix "$tmp/good.bin:1" "$tmp/bad_magic.bin:1")" tokens)"
# text
row 'empty.txt: empty file' "${c[@]}" --set data.source=text --set model.vocab_size=256 --set "data.path=$tmp/empty.txt"
row 'short.txt: the text holds 5 bytes' "${c[@]}" --set data.source=text --set model.vocab_size=256 --set "data.path=$tmp/short.txt"
row 'data.source "text" needs model.vocab_size >= 256' "${c[@]}" --set data.source=text --set "data.path=$tmp/short.txt"
row 'nothere.txt: cannot open' "${c[@]}" --set data.source=text --set model.vocab_size=256 --set "data.path=$tmp/nothere.txt"
# safetensors (--init-from)
row 'garbage.safetensors: header length' "${c[@]}" --init-from "$tmp/garbage.safetensors"
row 'tiny.safetensors: file is 3 bytes, shorter than 8' "${c[@]}" --init-from "$tmp/tiny.safetensors"
row 'huge_header.safetensors: header length 9223372036854775813 exceeds the file size' "${c[@]}" --init-from "$tmp/huge_header.safetensors"
row 'header_not_json.safetensors: header is not valid JSON' "${c[@]}" --init-from "$tmp/header_not_json.safetensors"
row 'deep.safetensors: .*nested deeper than 8 levels' "${c[@]}" --init-from "$tmp/deep.safetensors"
row 'exceed the data section' "${c[@]}" --init-from "$tmp/beyond.safetensors"
row "unsupported dtype 'F13'" "${c[@]}" --init-from "$tmp/dtype.safetensors"
row 'hold 128 bytes but f32\[1000000, 1000000\] needs' "${c[@]}" --init-from "$tmp/size_mismatch.safetensors"
row 'overlap' "${c[@]}" --init-from "$tmp/overlap.safetensors"
row "tensor 'transformer.wte.weight' is not a parameter of this llama model" "${c[@]}" --init-from "$tmp/wrong_name.safetensors"
row "missing tensor 'lm_head.weight' \[32, 32\]" "${c[@]}" --init-from "$tmp/missing.safetensors"
row "'model.norm.weight' has shape \[4, 8\], the model expects \[32\]" "${c[@]}" --init-from "$tmp/wrong_shape.safetensors"
row "'model.layers.0.self_attn.sinks' has shape \[3\], the model expects \[4\]" "${c[@]}" --set model.attention_sinks=true --init-from "$tmp/sinks_shape.safetensors"
row 'model.attention_sinks = "yes": expected true or false' "${c[@]}" --set model.attention_sinks=yes
row 'model.attention_sinks = 1: expected true or false' "${c[@]}" --set model.attention_sinks=1
row "'model.norm.weight' is i32, expected a float dtype" "${c[@]}" --init-from "$tmp/int_dtype.safetensors"
row "nan.safetensors: tensor 'model.norm.weight' holds a non-finite value (nan) at index 7" "${c[@]}" --init-from "$tmp/nan.safetensors"
row 'fifo: not a regular file' "${c[@]}" --init-from "$tmp/fifo"
# Hugging Face formats (--init-from, model.from, an HF config.json as --config)
row 'pickle.bin: a PyTorch pickle (torch.save zip format' "${c[@]}" --init-from "$tmp/pickle.bin"
row 'pickle_legacy.bin: a PyTorch pickle' "${c[@]}" --init-from "$tmp/pickle_legacy.bin"
row 'a_config.json: a JSON file, not safetensors' "${c[@]}" --init-from "$tmp/a_config.json"
row "escape.index.json: weight_map\['model.norm.weight'\] = \"../good.safetensors\": expected a file name" "${c[@]}" --init-from "$tmp/escape.index.json"
row 'absent.safetensors: cannot open' "${c[@]}" --init-from "$tmp/noshard.index.json"
row env:AUTOSP_PIPE_TIMEOUT=1 'fifo.index.json: a FIFO that nothing wrote to in 1 s' "${c[@]}" --init-from "$tmp/fifo.index.json"
row env:AUTOSP_PIPE_TIMEOUT=1 'hf_fifo/config.json: a FIFO that nothing wrote to in 1 s' "${c[@]}" --set "model.from=$tmp/hf_fifo"
row 'nomap.index.json: not a safetensors index' "${c[@]}" --init-from "$tmp/nomap.index.json"
row 'hf_pickle: holds PyTorch pickle weights (pytorch_model.bin)' "${c[@]}" --init-from "$tmp/hf_pickle"
row 'hf_noweights: holds neither model.safetensors nor model.safetensors.index.json' "${c[@]}" --init-from "$tmp/hf_noweights"
row "hf_heads/config.json: num_attention_heads is 8 but this run's model.num_attention_heads is 4" "${c[@]}" --init-from "$tmp/hf_heads"
row 'hf_noweights: a Hugging Face model directory, not a checkpoint' "${c[@]}" --resume "$tmp/hf_noweights"
# What people bring from other tools, named for what it is: llm.c's checkpoint and token shard and a
# torch.save zip given as weights; a PEFT adapter directory as the model, its weights or the run to
# resume; a DeepSpeed checkpoint directory to resume or start from.
$py - "$tmp" <<'PY'
import os, struct, sys
d = sys.argv[1]
hdr = [0] * 256
hdr[0], hdr[1], hdr[2], hdr[3] = 20240326, 3, 1024, 50257
open(os.path.join(d, "gpt2_124M.bin"), "wb").write(struct.pack("<256i", *hdr) + bytes(64))
open(os.path.join(d, "torch.pt"), "wb").write(b"PK\x03\x04" + bytes(60))
os.makedirs(os.path.join(d, "peft_adapter"))
open(os.path.join(d, "peft_adapter", "adapter_config.json"), "w").write('{"peft_type": "LORA", "r": 8}')
os.makedirs(os.path.join(d, "ds_ckpt", "global_step100"))
open(os.path.join(d, "ds_ckpt", "latest"), "w").write("global_step100")
open(os.path.join(d, "ds_ckpt", "global_step100", "mp_rank_00_model_states.pt"), "wb").write(b"PK\x03\x04")
PY
row 'gpt2_124M.bin: an llm.c model checkpoint (magic 20240326, version 3)' "${c[@]}" --init-from "$tmp/gpt2_124M.bin"
row 'good.bin: an llm.c token shard (magic 20240520)' "${c[@]}" --init-from "$tmp/good.bin"
row "torch.pt: a PyTorch pickle (torch.save zip format" "${c[@]}" --init-from "$tmp/torch.pt"
row 'peft_adapter: a PEFT adapter directory .*give it as lora.from' "${c[@]}" --set "model.from=$tmp/peft_adapter"
row 'peft_adapter: a PEFT adapter directory' "${c[@]}" --init-from "$tmp/peft_adapter"
row 'peft_adapter: a PEFT adapter directory' "${c[@]}" --resume "$tmp/peft_adapter"
row 'ds_ckpt: a DeepSpeed checkpoint directory (global_step100/mp_rank_00_model_states.pt)' "${c[@]}" --resume "$tmp/ds_ckpt"
row 'ds_ckpt: a DeepSpeed checkpoint directory' "${c[@]}" --init-from "$tmp/ds_ckpt"
row 'nothere: not a directory (model.from' "${c[@]}" --set "model.from=$tmp/nothere"
row 'model.from = 3: expected a Hugging Face model directory' "${c[@]}" --set model.from=3
row 'hf_garbled/config.json: not valid JSON' "${c[@]}" --set "model.from=$tmp/hf_garbled"
row 'model_type "bert" is not supported' "${c[@]}" --set "model.from=$tmp/hf_bert"
row '3 problems: | attention_bias = "yes": expected true or false | hidden_act = "gelu" is not supported.* | sliding_window = 4096 is not supported' "${c[@]}" --set "model.from=$tmp/hf_unsupported"
row 'rope_type "dynamic" is not supported' "${c[@]}" --set "model.from=$tmp/hf_dynamic"
row 'rope_parameters: "factor" = 0: expected a number >= 1' "${c[@]}" --set "model.from=$tmp/hf_yarn_factor"
row 'head_dim = 7: expected an even positive integer' "${c[@]}" --set "model.from=$tmp/hf_head_dim"
row 'layer_types\[0\] = "sliding_attention" is not supported (layer 0' "${c[@]}" --set "model.from=$tmp/hf_layer_types"
row 'model.layer_types\[1\] = "local": expected "full_attention" or "sliding_attention"' "${c[@]}" --set "model.from=$tmp/hf_window"
row 'model.layer_types has 1 entries for model.num_hidden_layers 2' "${c[@]}" --set model.arch=mistral --set model.sliding_window=8 --set model.num_hidden_layers=2 --set 'model.layer_types=["full_attention"]'
row 'model.max_window_layers = -1: expected an integer' "${c[@]}" --set model.arch=qwen2 --set model.max_window_layers=-1
row 'model.sliding_window = 0: expected an integer' "${c[@]}" --set model.arch=mistral --set model.sliding_window=0
row 'model.head_dim 3 must be even for RoPE' "${c[@]}" --set model.head_dim=3
row 'model.mlp_bias is a llama setting, not qwen2' "${c[@]}" --set model.arch=qwen2 --set model.mlp_bias=true
row "unknown key 'n_experts'" "${c[@]}" --set "model.from=$tmp/hf_unknown"
row 'swiglu_limit = 0: expected a positive number' "${c[@]}" --set "model.from=$tmp/hf_gptoss_limit"
row 'quantization_config.quant_method = "gptq" is not supported' "${c[@]}" --set "model.from=$tmp/hf_gptoss_quant"
row 'model.num_experts_per_tok 5 exceeds model.num_local_experts 4' "${c[@]}" --set "model.from=$tmp/hf_gptoss_topk" --set model.arch=gpt_oss
row 'model.swiglu_limit = -1: expected a value in' "${c[@]}" --set model.arch=gpt_oss --set model.swiglu_limit=-1
row 'hf_dtypes/config.json: torch_dtype = "float32" differs from dtype = "bfloat16"' "${c[@]}" --set "model.from=$tmp/hf_dtypes"
row "hf_noweights: holds neither" "${c[@]}" --set "model.from=$tmp/hf_noweights"
row "hf_as_config.json: unknown key 'qkv_bias'" --config "$tmp/hf_as_config.json"
row 'hf_mrope/config.json: use_mrope = "yes" is not supported (multimodal RoPE' "${c[@]}" --set "model.from=$tmp/hf_mrope"
row 'hf_interleaved/config.json: rope_interleaved = 1 is not supported' "${c[@]}" --set "model.from=$tmp/hf_interleaved"
row 'dual_chunk_attention_config = \[1,2\] is not supported' "${c[@]}" --set "model.from=$tmp/hf_dca"
row "unknown key 'rms_norm_epsilon' (did you mean 'rms_norm_eps'?)" "${c[@]}" --set "model.from=$tmp/hf_typo"
row "3 problems: | rope_interleaved = true is not supported.* | use_mrope = true is not supported.* | unknown key 'n_expertz'" "${c[@]}" --set "model.from=$tmp/hf_many"
row 'model.sliding_window = \[\]: expected an integer' "${c[@]}" --set model.arch=mistral --set 'model.sliding_window=[]'
row 'model.sliding_window = "off": expected an integer' "${c[@]}" --set model.arch=mistral --set model.sliding_window=off
row "2 problems: | unknown key 'model.n_embd' (did you mean 'model.hidden_size'?) | unknown key 'model.n_layer' (did you mean 'model.num_hidden_layers'?)" "${c[@]}" --set model.n_embd=32 --set model.n_layer=1
row "model.rope_scaling = 3: expected an object or null" "${c[@]}" --set model.rope_scaling=3
row 'model.rope_scaling: rope_type "llama3" needs "factor"' "${c[@]}" --set 'model.rope_scaling={"rope_type":"llama3"}'  # (--set splits at commas)
row "train.max_shard_mb" "${c[@]}" --set train.max_shard_mb=0
# checkpoint directories (--resume)
row 'nowhere: no such checkpoint directory' "${c[@]}" --resume "$tmp/nowhere"
row 'emptyckpt: holds no checkpoint' "${c[@]}" --resume "$tmp/emptyckpt"
row 'nometa_root/step_00000002: the newest checkpoint has no meta.json' "${c[@]}" --resume "$tmp/nometa_root"
row 'flipped/model.safetensors: checksum mismatch' "${c[@]}" --resume "$flipped"
fifometa=$(ck fifometa) && rm "$fifometa/meta.json" && mkfifo "$fifometa/meta.json"
row env:AUTOSP_PIPE_TIMEOUT=1 'fifometa/meta.json: a FIFO that nothing wrote to in 1 s' "${c[@]}" --resume "$fifometa"
row "\-\-resume .*step_00000002: the checkpoint is at step 2, past the run's 1 steps" "${c[@]}" --resume "$good_ck" --steps 1
row '\-\-dump-grads /nonexist/g.safetensors: /nonexist is not a directory' "${c[@]}" --dump-grads /nonexist/g.safetensors
row 'truncated/optimizer.safetensors: 500 bytes, meta.json records' "${c[@]}" --resume "$truncated"
row 'garbled/meta.json: not valid JSON' "${c[@]}" --resume "$garbled"
row "nofiles/meta.json: no 'files' checksums" "${c[@]}" --resume "$nofiles"
row 'format1/meta.json: unsupported checkpoint format 1' "${c[@]}" --resume "$format1"
row "badstep/meta.json: 'step' must be a non-negative integer" "${c[@]}" --resume "$badstep"
row 'was written for model' "${c[@]}" --set model.hidden_size=64 --resume "$good_ck"
row 'was written with train.seed 1234, this run has 99' "${c[@]}" --set train.seed=99 --resume "$good_ck"
# learning-rate schedules (train.lr_schedule and its keys)
row 'train.lr_schedule = "exp": expected one of cosine|cosine_with_min_lr|linear' "${c[@]}" --set train.lr_schedule=exp
row 'train.schedule_steps = -1: expected an integer' "${c[@]}" --set train.schedule_steps=-1
row 'train.decay_fraction = 2: expected a value in \[0, 1\]' "${c[@]}" --set train.decay_fraction=2
row 'train.decay_type = "sqrt": expected one of cosine|linear|1-sqrt' "${c[@]}" --set train.decay_type=sqrt
row 'train.warmup_type = "exp": expected one of log|linear' "${c[@]}" --set train.warmup_type=exp
row 'train.warmup_min_lr = -1: expected a value in' "${c[@]}" --set train.warmup_min_lr=-1
row 'train.lr_schedule "ds_warmup" needs train.warmup_steps >= 1' "${c[@]}" --set train.lr_schedule=ds_warmup --set train.warmup_steps=0
row 'train.warmup_steps 10 + the decay.s 2 steps' "${c[@]}" --set train.lr_schedule=wsd --set train.decay_fraction=0.9
# the rule reads the steps the run takes: --steps, not the config's train.steps (issue 48)
row 'train.warmup_steps 4 + the decay.s 3 steps (train.decay_fraction 0.5) exceed the schedule.s 5 steps' "${c[@]}" \
  --set train.steps=100 --set train.lr_schedule=wsd --set train.warmup_steps=4 --set train.decay_fraction=0.5 --steps 5
# DeepSpeed configs (--deepspeed)
row 'nope.json: cannot open (No such file or directory; expected a DeepSpeed config)' "${c[@]}" --deepspeed "$tmp/nope.json"
row env:AUTOSP_PIPE_TIMEOUT=1 'fifo: a FIFO that nothing wrote to in 1 s' "${c[@]}" --deepspeed "$tmp/fifo"
row '/dev/fd/[0-9]*: gradient_clipping = "high"' "${c[@]}" --deepspeed <(cat "$tmp/ds_clip.json")
row 'adir: is a directory, not a DeepSpeed config' "${c[@]}" --deepspeed "$tmp/adir"
row 'ds_truncated.json: not valid JSON' "${c[@]}" --deepspeed "$tmp/ds_truncated.json"
row 'ds_array.json: expected a JSON object at the top level' "${c[@]}" --deepspeed "$tmp/ds_array.json"
row 'train_batch_size 8 != train_micro_batch_size_per_gpu 2 × gradient_accumulation_steps 2 × dp 1' "${c[@]}" --deepspeed "$tmp/ds_batch.json"
row 'ds_fp16.json: fp16.enabled = true: not supported' "${c[@]}" --deepspeed "$tmp/ds_fp16.json"
row 'zero_optimization.offload_optimizer = .*not supported' "${c[@]}" --deepspeed "$tmp/ds_offload.json"
row 'optimizer.type = "Lamb": not supported' "${c[@]}" --deepspeed "$tmp/ds_lamb.json"
row 'adam_w_mode false' "${c[@]}" --deepspeed "$tmp/ds_adam_l2.json"
row 'scheduler.type = "OneCycle": not supported' "${c[@]}" --deepspeed "$tmp/ds_onecycle.json"
row 'WarmupCosineLR needs params.total_num_steps' "${c[@]}" --deepspeed "$tmp/ds_no_total.json"
row 'scheduler.params.warmup_num_steps = 0: expected a positive integer' "${c[@]}" --deepspeed "$tmp/ds_warmup0.json"
row 'compile.passes = \["z3"\]: must contain "autosp"' "${c[@]}" --deepspeed "$tmp/ds_passes.json"
row "unknown DeepSpeed key 'train_micro_batch'" "${c[@]}" --deepspeed "$tmp/ds_unknown.json"
row 'gradient_clipping = 0.5 conflicts with train.grad_clip = 2' "${c[@]}" --set train.grad_clip=2 --deepspeed "$tmp/ds_conflict.json"
row 'optimizer.type = "auto": not supported' "${c[@]}" --deepspeed "$tmp/ds_auto_type.json"
row 'zero_optimization.reduce_bucket_size = -5: expected a positive number' "${c[@]}" --deepspeed "$tmp/ds_bucket.json"
row 'zero_optimization.stage = 5 (our zero_optimization.stage): expected an integer in \[0, 3\]' "${c[@]}" --deepspeed "$tmp/ds_stage.json"
row 'sequence_parallel_size 3 does not divide the world size 1' "${c[@]}" --deepspeed "$tmp/ds_sp.json"
row 'gradient_clipping = "high" (our train.grad_clip): expected a number' "${c[@]}" --deepspeed "$tmp/ds_clip.json"
row 'bf16.enabled = "yes": expected true, false or "auto"' "${c[@]}" --deepspeed "$tmp/ds_bf16.json"
row 'bf16.auto_cast = "sometimes": not supported by autosp-train' "${c[@]}" --deepspeed "$tmp/ds_auto_cast.json"
row "unknown DeepSpeed key 'sequence_parallel' (did you mean 'sequence_parallel_size'?)" "${c[@]}" --deepspeed "$tmp/ds_sp_block.json"
row "unknown DeepSpeed key 'bf16.loss_scal' (did you mean 'bf16.loss_scale'?)" "${c[@]}" --deepspeed "$tmp/ds_scale_typo.json"
row "ds_many.json: 3 problems: | fp16.enabled = true: not supported.* | unknown DeepSpeed key 'sequence_parallel'.* | zero_optimization.offload_optimizer = " "${c[@]}" --deepspeed "$tmp/ds_many.json"
row 'train.min_lr 0.0001 exceeds train.lr 1e-05 (with the DeepSpeed config' "${c[@]}" --set train.lr_schedule=cosine --deepspeed "$tmp/ds_lowlr.json"
# on 2 ranks: found before MPI starts (both ranks report it), and found after (the job still ends with 2)
row mpi 'deep.json: JSON nested deeper' --config "$tmp/deep.json"
[ "${last_lines:-0}" -eq 2 ] || { echo "FAIL: expected the error from both ranks, got $last_lines line(s)"; fail=1; }
row mpi env:AUTOSP_FAULT=rank:1,kind:exit "AUTOSP_FAULT='rank:1,kind:exit': missing field 'step'" "${c[@]}"
row mpi 'big_token.bin: token 32' "${c[@]}" "${tokens[@]}$tmp/big_token.bin"
row mpi 'flipped/model.safetensors: checksum mismatch' "${c[@]}" --resume "$flipped"
row mpi 'does not divide the world size' "${c[@]}" --set sequence_parallel.autosp_size=4
row mpi 'zero_optimization.stage = "two": expected an integer' "${c[@]}" --set zero_optimization.stage=two
row mpi 'train_batch_size 4 != train_micro_batch_size_per_gpu 2 × gradient_accumulation_steps 2 × dp 2' "${c[@]}" --deepspeed "$tmp/ds_batch_dp2.json"

# --help lists every flag the binary accepts.
"$bin" --help >"$tmp/help" 2>&1 || { echo "FAIL: --help exited $?"; fail=1; }
for flag in --config --deepspeed --set --steps --init-from --resume --metrics --dump-grads --quiet --help \
            AUTOSP_FAULT AUTOSP_COLLECTIVE_TIMEOUT; do
  grep -q -- "$flag" "$tmp/help" || { echo "FAIL: --help does not list $flag"; fail=1; }
done
flags_in_source=$(grep -o '("[a-z,-]*", "[a-z]' "$2/apps/train.cpp" | grep -o '"[a-z,-]*"' | grep -o '[a-z-]\{2,\}' | sort -u)
for flag in $flags_in_source; do
  grep -q -- "--$flag" "$tmp/help" || { echo "FAIL: --help does not list --$flag (declared in apps/train.cpp)"; fail=1; }
done

echo "malformed_inputs: $rows rows"
if [ $fail -eq 0 ]; then echo "malformed_inputs: all checks passed"; fi
exit $fail
