#!/usr/bin/python3
"""Minimal, independent safetensors reader/writer (no `safetensors` package).

File layout:
    8 bytes   little-endian u64 N = length of the JSON header
    N bytes   UTF-8 JSON: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
                           "__metadata__": {"key": "string value", ...}}   (metadata optional)
    rest      data section; data_offsets are byte offsets into it (little-endian, row-major)

API:
    load(path)                -> (OrderedDict name -> torch.Tensor, metadata dict)
    save(path, tensors, metadata=None)   tensors: mapping name -> torch.Tensor or numpy array
    loads(bytes) / dumps(tensors, metadata) work on bytes.

Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.  BF16 is handled through an int16 view
(torch 1.13 has no numpy bfloat16).  Errors raise SafetensorsError with a message naming the file
and the tensor.

Run `/usr/bin/python3 tests/ref/safetensors_io.py` for a round-trip self-check.
"""
import collections
import json
import struct
import sys

import numpy as np
import torch


class SafetensorsError(ValueError):
    pass


# safetensors dtype -> (numpy little-endian storage dtype, torch dtype, bytes per element)
_DTYPES = {
    "F64": ("<f8", torch.float64, 8),
    "F32": ("<f4", torch.float32, 4),
    "F16": ("<f2", torch.float16, 2),
    "BF16": ("<i2", torch.bfloat16, 2),  # stored as raw 16-bit patterns, viewed as bfloat16
    "I64": ("<i8", torch.int64, 8),
    "I32": ("<i4", torch.int32, 4),
    "I16": ("<i2", torch.int16, 2),
    "I8": ("i1", torch.int8, 1),
    "U8": ("u1", torch.uint8, 1),
    "BOOL": ("u1", torch.bool, 1),
}
_TORCH_TO_ST = {v[1]: k for k, v in _DTYPES.items()}
_NUMPY_TO_ST = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
    np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL",
}

MAX_HEADER_BYTES = 100 * 1024 * 1024


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def loads(buf, source="<bytes>"):
    """Parse a safetensors byte string. Returns (OrderedDict name -> torch.Tensor, metadata)."""
    buf = memoryview(buf)
    if len(buf) < 8:
        raise SafetensorsError(f"{source}: file is {len(buf)} bytes, shorter than the 8-byte header length")
    (hlen,) = struct.unpack("<Q", bytes(buf[:8]))
    if hlen > MAX_HEADER_BYTES or 8 + hlen > len(buf):
        raise SafetensorsError(f"{source}: header length {hlen} does not fit in a file of {len(buf)} bytes")
    try:
        header = json.loads(bytes(buf[8:8 + hlen]).decode("utf-8"),
                            object_pairs_hook=collections.OrderedDict)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{source}: header is not valid UTF-8 JSON ({e})")
    if not isinstance(header, dict):
        raise SafetensorsError(f"{source}: header is not a JSON object")
    data = buf[8 + hlen:]
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{source}: __metadata__ must be an object of strings")
    out = collections.OrderedDict()
    spans = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) - {"dtype", "shape", "data_offsets"} \
                or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise SafetensorsError(f"{source}: tensor '{name}': entry must have dtype, shape, data_offsets")
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dt not in _DTYPES:
            raise SafetensorsError(f"{source}: tensor '{name}': unsupported dtype {dt!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise SafetensorsError(f"{source}: tensor '{name}': bad shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1] <= len(data)):
            raise SafetensorsError(f"{source}: tensor '{name}': data_offsets {offs!r} outside the "
                                   f"{len(data)}-byte data section")
        npdt, tdt, size = _DTYPES[dt]
        nbytes = _numel(shape) * size
        if offs[1] - offs[0] != nbytes:
            raise SafetensorsError(f"{source}: tensor '{name}': {offs[1] - offs[0]} bytes for "
                                   f"{dt}{shape} which needs {nbytes}")
        spans.append((offs[0], offs[1], name))
        arr = np.frombuffer(data[offs[0]:offs[1]], dtype=npdt).copy().reshape(tuple(shape))
        if dt == "BF16":
            t = torch.from_numpy(arr).view(torch.bfloat16)
        elif dt == "BOOL":
            if arr.size and arr.max() > 1:
                raise SafetensorsError(f"{source}: tensor '{name}': BOOL byte other than 0/1")
            t = torch.from_numpy(arr.astype(np.bool_))
        else:
            t = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("=")))
        out[name] = t
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise SafetensorsError(f"{source}: tensors '{n0}' and '{n1}' overlap in the data section")
    return out, dict(metadata)


def load(path):
    """Read a .safetensors file. Returns (OrderedDict name -> torch.Tensor, metadata dict)."""
    with open(path, "rb") as f:
        buf = f.read()
    return loads(buf, source=str(path))


def _to_bytes(name, t):
    """Return (dtype string, shape list, little-endian bytes) for a torch tensor or numpy array."""
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().contiguous()
        if t.dtype not in _TORCH_TO_ST:
            raise SafetensorsError(f"tensor '{name}': unsupported torch dtype {t.dtype}")
        dt = _TORCH_TO_ST[t.dtype]
        if t.dtype == torch.bfloat16:
            arr = t.view(torch.int16).numpy()
        elif t.dtype == torch.bool:
            arr = t.numpy().astype(np.uint8)
        else:
            arr = t.numpy()
    else:
        arr = np.asarray(t)
        if arr.dtype.newbyteorder("=") not in _NUMPY_TO_ST:
            raise SafetensorsError(f"tensor '{name}': unsupported numpy dtype {arr.dtype}")
        dt = _NUMPY_TO_ST[arr.dtype.newbyteorder("=")]
        if dt == "BOOL":
            arr = arr.astype(np.uint8)
    npdt = _DTYPES[dt][0]
    shape = list(arr.shape)  # before ascontiguousarray, which turns 0-d into 1-d
    arr = np.ascontiguousarray(arr, dtype=npdt)
    return dt, shape, arr.tobytes(order="C")


def dumps(tensors, metadata=None):
    """Serialise a mapping name -> tensor to safetensors bytes (header padded to 8 bytes)."""
    header = collections.OrderedDict()
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("__metadata__ keys and values must be strings")
        header["__metadata__"] = dict(metadata)
    chunks, off = [], 0
    for name, t in tensors.items():
        if name == "__metadata__":
            raise SafetensorsError("'__metadata__' is not a valid tensor name")
        dt, shape, raw = _to_bytes(name, t)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((-len(hbytes)) % 8)
    return struct.pack("<Q", len(hbytes)) + hbytes + b"".join(chunks)


def save(path, tensors, metadata=None):
    data = dumps(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)


def bf16_bits_to_float32(bits):
    """Independent bf16 decoding: u16 patterns (numpy int16/uint16) -> float32 via << 16."""
    return (np.asarray(bits).astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def selfcheck():
    """Round-trip every dtype, scalars, empty tensors, metadata; check bytes by hand. Raises on failure."""
    g = torch.Generator().manual_seed(0)
    tensors = collections.OrderedDict()
    tensors["f64"] = torch.randn(3, 4, generator=g, dtype=torch.float64)
    tensors["f32"] = torch.randn(2, 3, 5, generator=g)
    tensors["f16"] = torch.randn(7, generator=g).half()
    tensors["bf16"] = torch.randn(4, 3, generator=g).bfloat16()
    tensors["i64"] = torch.tensor([[-100, 0, 2**40], [1, -2**62, 7]], dtype=torch.int64)
    tensors["i32"] = torch.tensor([-(2**31), 2**31 - 1, 0], dtype=torch.int32)
    tensors["i16"] = torch.tensor([-5, 300], dtype=torch.int16)
    tensors["i8"] = torch.tensor([-128, 127], dtype=torch.int8)
    tensors["u8"] = torch.tensor([0, 255], dtype=torch.uint8)
    tensors["bool"] = torch.tensor([True, False, True])
    tensors["scalar"] = torch.tensor(3.5, dtype=torch.float64)
    tensors["empty"] = torch.zeros(0, 4)
    tensors["np_f32"] = np.arange(6, dtype=np.float32).reshape(2, 3)
    meta = {"format": "pt", "note": "ünïcode"}
    raw = dumps(tensors, meta)
    (hlen,) = struct.unpack("<Q", raw[:8])
    assert (8 + hlen) % 8 == 0, "header not padded to 8 bytes"
    back, meta2 = loads(raw)
    assert meta2 == meta, (meta2, meta)
    assert list(back) == list(tensors), list(back)
    for k, v in tensors.items():
        w = back[k]
        v = torch.from_numpy(v) if isinstance(v, np.ndarray) else v
        assert w.dtype == v.dtype and tuple(w.shape) == tuple(v.shape), (k, w.dtype, w.shape)
        assert torch.equal(w, v), k
    # byte-level checks against hand-computed encodings
    one = dumps({"x": torch.tensor([1.0, -2.0], dtype=torch.bfloat16)})
    (hl,) = struct.unpack("<Q", one[:8])
    assert one[8 + hl:] == bytes([0x80, 0x3F, 0x00, 0xC0]), one[8 + hl:]
    hdr = json.loads(one[8:8 + hl])
    assert hdr == {"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, hdr
    f32 = dumps({"y": torch.tensor([1.0])})
    assert f32[-4:] == bytes([0x00, 0x00, 0x80, 0x3F])
    bits = back["bf16"].view(torch.int16).numpy()
    assert np.array_equal(bf16_bits_to_float32(bits), back["bf16"].float().numpy())
    # a hand-written file (header without padding, tensors in reverse order)
    hj = json.dumps({"b": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]},
                     "a": {"dtype": "F64", "shape": [], "data_offsets": [4, 12]}}).encode()
    hand = struct.pack("<Q", len(hj)) + hj + struct.pack("<i", -7) + struct.pack("<d", 0.25)
    hb, _ = loads(hand)
    assert hb["b"].tolist() == [-7] and hb["a"].item() == 0.25 and hb["a"].shape == ()
    # malformed inputs are clear errors
    for bad in (b"\x01", struct.pack("<Q", 999) + b"{}", struct.pack("<Q", 2) + b"[]",
                hand[:-1], struct.pack("<Q", len(hj)) + hj.replace(b"I32", b"X99") + b"\0" * 12):
        try:
            loads(bad)
        except SafetensorsError:
            pass
        else:
            raise AssertionError(f"malformed input accepted: {bad[:40]!r}")


if __name__ == "__main__":
    selfcheck()
    print("safetensors_io selfcheck: ok")
    sys.exit(0)
