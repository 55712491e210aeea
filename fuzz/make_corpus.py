#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ (committed; rerun only to change them).
Each seed is a small valid input, so the fuzzers start from what the parsers accept."""
import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# config: the shipped configs, and JSON + NUL + --set lines.
for name in ["default.json", "gpt2-tiny.json", "llama-tiny.json", "llama-sp4.json"]:
    with open(os.path.join(root, "configs", name), "rb") as f:
        write("config", name, f.read())
write("config", "empty-object", "{}")
write("config", "sets", '{"model": {"arch": "llama"}}\0train.lr=0.01\nmodel.num_key_value_heads=2\ndata.path=x.bin')
write("config", "tokens", '{"data": {"source": "tokens", "path": "a.bin", "seq_len": 64}, "train": {"keep_checkpoints": 0}}')
# Hugging Face config.json files as the hub serves them (a bare config.json is a run config too).
hf = os.path.join(root, "tests", "config", "fixtures", "real_world", "hf")
for name in sorted(os.listdir(hf)):
    with open(os.path.join(hf, name), "rb") as f:
        write("config", "hf-" + name, f.read() + b"\0data.seq_len=64")


# safetensors: [u64 header length][JSON header][data]
def st(tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


write("safetensors", "empty", st({}))
write("safetensors", "one-f32", st({"w": ("F32", [2, 3], struct.pack("<6f", *range(6)))}))
write("safetensors", "mixed", st({"a": ("F64", [2], struct.pack("<2d", 1.5, -2)),
                                  "b": ("I64", [1, 1], struct.pack("<q", 7)),
                                  "c": ("BF16", [3], b"\x80\x3f" * 3),
                                  "d": ("F16", [0, 4], b"")}, {"format": "pt"}))
write("safetensors", "llama-norm", st({"model.norm.weight": ("F32", [8], struct.pack("<8f", *[1.0] * 8))}))


# token shards: 256 int32 header (magic, version, count, then seq_len/batch/vocab/step bytes the
# fuzzer reads from ints 3..6), then uint16 or uint32 tokens.
def shard(magic, version, tokens, width, extra=(7, 1, 300, 5)):
    hdr = [magic, version, len(tokens)] + list(extra) + [0] * 249
    return struct.pack("<256i", *hdr) + struct.pack("<%d%s" % (len(tokens), width), *tokens)


write("tokens", "u16", shard(20240520, 1, [t * 7 % 256 for t in range(64)], "H"))
write("tokens", "u32", shard(20240801, 7, [t * 13 % 300 for t in range(40)], "I"))
write("tokens", "u16-short", shard(20240520, 1, list(range(9)), "H", (8, 2, 20, 1)))


# loss_mask: .npy files of 64 values (the fuzzer's shard holds 64 tokens): uint8 and bool, format 1.0 and 2.0.
def npy(descr, values, version=1):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, len(values))
    prefix = 10 if version == 1 else 12
    h += " " * ((64 - (prefix + len(h) + 1) % 64) % 64) + "\n"
    size = struct.pack("<H", len(h)) if version == 1 else struct.pack("<I", len(h))
    return b"\x93NUMPY" + bytes([version, 0]) + size + h.encode() + bytes(values)
write("loss_mask", "u1", npy("|u1", [i % 3 != 0 for i in range(64)]))
write("loss_mask", "b1-v2", npy("|b1", [i % 2 for i in range(64)], version=2))
write("loss_mask", "zeros", npy("|u1", [0] * 64))

