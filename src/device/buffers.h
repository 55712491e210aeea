// Raw buffers on either device, for host code that moves data itself instead of running graph
// kernels (comm/threads.cpp: P rank threads meeting in shared memory): byte copies, sums of the
// ranks' parts in a fixed order, scratch tensors, and events that order one thread's compute
// stream after another's. Host buffers are plain loops; CUDA buffers go on the calling thread's
// compute stream of their device (device/cuda/device.h) through device/cuda/buffers.h. In builds
// without CUDA a CUDA device is a UsageError (device/cuda_absent.cpp). Knows nothing of graphs or
// communicators.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace autosp {

// n bytes from src to dst on device d: a memcpy on the host; on CUDA enqueued on d's compute
// stream (either pointer may be on any device: peers' buffers). Nothing when n is 0 or dst == src.
void copy_bytes(void* dst, const void* src, size_t n, Device d);

// dst[e] = Σ_i parts[i][e] for e < n, adding the parts in order (n elements of `dtype` on d; f32,
// f64, bf16, and i64 on the host). dst may be one of the parts. bf16 sums in float and rounds once.
void sum_parts(const std::vector<const void*>& parts, void* dst, int64_t n, DType dtype, Device d);

// The allocator of device d: the host's, or on CUDA the calling thread's (device/cuda/device.h
// cuda_allocator).
Allocator& allocator_of(Device d);

// A contiguous tensor of n elements of `dtype` on d (from allocator_of(d)).
Tensor empty_on(int64_t n, DType dtype, Device d);

// Events on d's compute stream, an opaque handle (cudaEvent_t); all three do nothing on the host.
// record_event creates `event` on first use (null) and records the stream's work so far;
// wait_event makes d's compute stream wait for it; destroy_event frees it and never throws.
void record_event(void*& event, Device d);
void wait_event(void* event, Device d);
void destroy_event(void* event) noexcept;

}  // namespace autosp
