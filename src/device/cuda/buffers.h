// The CUDA side of device/buffers.h: byte copies, ordered sums (kernels/cuda/elementwise's sum_to)
// and events, on the calling thread's compute stream of `device`. No CUDA header needed; builds
// without CUDA get stubs that throw UsageError (destroy_event: nothing) in device/cuda_absent.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace autosp::gpu {

void copy_bytes(void* dst, const void* src, size_t n, int device);
// The parts side by side [P, n] in a scratch tensor, then summed over P in a fixed order.
void sum_parts(const std::vector<const void*>& parts, void* dst, int64_t n, DType dtype, int device);
void record_event(void*& event, int device);
void wait_event(void* event, int device);
void destroy_event(void* event) noexcept;

}  // namespace autosp::gpu
