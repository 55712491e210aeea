// Copies between device tensors on a stream: a strided view made contiguous, and dtype casts.
// Used by the device runtime (to_device) and the CUDA launchers; host C++ over the launchers of
// kernels/cuda/elementwise. Knows nothing of graphs.
#pragma once

#include "tensor/tensor.h"

struct CUstream_st;

namespace autosp::gpu {

// `view` (any strides, on a CUDA device) copied into `dst` (contiguous, same shape and element size).
void copy_strided_into(const Tensor& view, const Tensor& dst, CUstream_st* stream);

// `t` itself when contiguous, else a contiguous copy from `alloc`.
Tensor contiguous(const Tensor& t, Allocator& alloc, CUstream_st* stream);

// dst = src converted to dst's dtype (same shape, both contiguous; a plain copy when the dtypes
// match). Pairs the kernels have: f32 ↔ bf16, f32 ↔ f64, f64 ↔ bf16, f32 ↔ f16, i32 ↔ i64; any
// other pair is a UsageError naming both dtypes.
void cast_into(const Tensor& src, const Tensor& dst, CUstream_st* stream);

// `t` converted to `dtype` (a new tensor from `alloc`; `t` itself when the dtype matches and it is
// contiguous).
Tensor cast(const Tensor& t, DType dtype, Allocator& alloc, CUstream_st* stream);

}  // namespace autosp::gpu
