// The safetensors file format: the checkpoint, --init-from and --dump-grads format.
//
//   [u64 little-endian N] [N bytes of UTF-8 JSON header, space-padded] [data section]
//   header: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"key": "value"}}   (offsets are relative to the data section)
//
// The loader trusts nothing in the file: every malformation is a UsageError that starts with the
// path, and no size from the header is allocated before it is checked against the file's size.
// The writer is atomic: a failed save leaves any existing file at `path` untouched.
// Knows nothing of graphs, models or devices other than the CPU.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace autosp {

// A "U8" tensor's bytes, row-major. DType has no u8: the one reader of bytes is a dequantizing
// step (tensor/mxfp4.h: MXFP4 blocks and scales), which makes float tensors of them.
struct ByteTensor {
  Shape shape;
  std::vector<uint8_t> data;
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;        // CPU tensors, contiguous
  std::map<std::string, ByteTensor> bytes;      // "U8" tensors, read only when asked for (with_bytes)
  std::map<std::string, std::string> metadata;  // the "__metadata__" object (string → string)
};

// Reads the whole file. Malformed input → UsageError "<path>: <what is wrong>";
// a read that fails after validation → RuntimeFailure. `with_bytes`: "U8" tensors go to `bytes`
// (else they are refused as an unsupported dtype, as every other dtype DType lacks).
SafetensorsFile load_safetensors(const std::string& path, bool with_bytes = false);

// Writes `tensors` (CPU, any dtype and strides) in name order to "<path>.tmp.<pid>", fsyncs it,
// renames it over `path` and fsyncs the directory. The header is padded with spaces to a multiple
// of 8 bytes, like the reference writer. I/O failure → RuntimeFailure naming the path.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace autosp
