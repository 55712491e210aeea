// The CUDA side of device/buffers.h (see buffers.h).
#include "device/cuda/buffers.h"

#include <cuda_runtime_api.h>

#include "device/cuda/device.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"

namespace autosp::gpu {

void copy_bytes(void* dst, const void* src, size_t n, int device) {
  if (n == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, compute_stream(device)));
}

void sum_parts(const std::vector<const void*>& parts, void* dst, int64_t n, DType dtype, int device) {
  if (n == 0) return;
  const int64_t P = static_cast<int64_t>(parts.size());
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  Tensor stack = Tensor::empty({P, n}, dtype, cuda_allocator(device));  // [P, n]
  for (int64_t i = 0; i < P; ++i)
    copy_bytes(static_cast<char*>(stack.raw()) + static_cast<size_t>(i) * bytes, parts[static_cast<size_t>(i)], bytes,
               device);
  const int64_t x_shape[2] = {P, n}, out_shape[2] = {1, n};
  const cudaStream_t s = compute_stream(device);
  switch (dtype) {
    case DType::f32: return cuda::sum_to(stack.data<float>(), 2, x_shape, out_shape, static_cast<float*>(dst), s);
    case DType::f64: return cuda::sum_to(stack.data<double>(), 2, x_shape, out_shape, static_cast<double*>(dst), s);
    case DType::bf16:
      return cuda::sum_to(static_cast<const cuda::bf16*>(stack.raw()), 2, x_shape, out_shape,
                          static_cast<cuda::bf16*>(dst), s);
    default: break;
  }
  AUTOSP_ASSERT(false, "CUDA sum of ", dtype_name(dtype), " parts (f32, f64, bf16 only)");
}

void record_event(void*& event, int device) {
  if (!event) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event = e;
  }
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), compute_stream(device)));
}

void wait_event(void* event, int device) {
  AUTOSP_ASSERT(event != nullptr, "a CUDA stream waiting on an event never recorded");
  CUDA_CHECK(cudaStreamWaitEvent(compute_stream(device), static_cast<cudaEvent_t>(event), 0));
}

void destroy_event(void* event) noexcept {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));  // errors ignored: called from destructors
}

}  // namespace autosp::gpu
