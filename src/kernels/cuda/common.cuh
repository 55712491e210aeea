// Shared by every CUDA kernel family: error checks that throw with file:line, the storage types
// (float, double, bf16, f16) and their accumulation types, load/store helpers that widen to the
// accumulation type, warp and block reductions in a fixed order, launch-size helpers and
// stream-ordered scratch memory. Knows nothing of graphs, tensors or the runtime.
//
// The top half is plain host C++ (headers of the families include it from .cpp files compiled by
// the host compiler); everything under `#if defined(__CUDACC__)` is for the .cu files only (and for
// the CPU emulation of kernels in tests/cuda/emulation.h).
//
// Precision: a kernel stores T and computes in acc_t<T>: float for float, bf16 and f16, double for
// double. Reductions are deterministic: every sum is split by the sizes alone (never by timing or
// the number of SMs) and combined in a fixed order; no float is ever added atomically.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "tensor/check.h"

namespace autosp::cuda {

using bf16 = __nv_bfloat16;  // storage only: arithmetic happens in acc_t<bf16> = float
using f16 = __half;

template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
// The type a kernel accumulates a T in.
template <class T>
using acc_t = typename AccOf<T>::type;

namespace detail {
[[noreturn]] void throw_cuda(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t st, const char* expr, const char* file, int line);
}  // namespace detail

// Stream-ordered scratch memory (cudaMallocAsync on `stream`, freed with cudaFreeAsync when the
// scope ends). For the small temporaries some launchers need (partial sums, sort buffers);
// nothing is kept between calls.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class U>
  U* as() const {
    return static_cast<U*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace autosp::cuda

// Throws autosp::RuntimeFailure "CUDA error <name>: <text> in <expr> at file:line".
#ifndef CUDA_CHECK  // (tests/cuda/emulation.h has its own)
#define CUDA_CHECK(expr)                                                                                        \
  do {                                                                                                          \
    const cudaError_t autosp_err_ = (expr);                                                                     \
    if (autosp_err_ != cudaSuccess) ::autosp::cuda::detail::throw_cuda(autosp_err_, #expr, __FILE__, __LINE__); \
  } while (0)
#endif

#define CUBLAS_CHECK(expr)                                                         \
  do {                                                                             \
    const cublasStatus_t autosp_st_ = (expr);                                      \
    if (autosp_st_ != CUBLAS_STATUS_SUCCESS)                                       \
      ::autosp::cuda::detail::throw_cublas(autosp_st_, #expr, __FILE__, __LINE__); \
  } while (0)

#if defined(__CUDACC__) || defined(AUTOSP_CUDA_EMULATION)  // tests/cuda/emulation.h

namespace autosp::cuda {

inline constexpr int kWarp = 32;

// ---- conversions -----------------------------------------------------------------------------

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_acc(f16 x) { return __half2float(x); }

// An accumulator (float or double) rounded to the storage type T (round to nearest even).
template <class T, class A>
__device__ __forceinline__ T from_acc(A x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __float2bfloat16_rn(float(x));
  } else if constexpr (std::is_same_v<T, f16>) {
    return __float2half_rn(float(x));
  } else {
    return T(x);
  }
}

// p[i] widened to acc_t<T>, and v rounded into p[i].
template <class T>
__device__ __forceinline__ acc_t<T> load(const T* p, int64_t i) {
  return to_acc(p[i]);
}
template <class T>
__device__ __forceinline__ void store(T* p, int64_t i, acc_t<T> v) {
  p[i] = from_acc<T>(v);
}

// ---- math overloads (float or double, so templates stay in their precision) -----------------

__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return exp(x); }
__device__ __forceinline__ float dlog(float x) { return logf(x); }
__device__ __forceinline__ double dlog(double x) { return log(x); }
__device__ __forceinline__ float dsqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double dsqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float dtanh(float x) { return tanhf(x); }
__device__ __forceinline__ double dtanh(double x) { return tanh(x); }
__device__ __forceinline__ float dmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double dmax(double a, double b) { return fmax(a, b); }

// ---- reductions (every lane gets the result; the butterfly order is fixed) --------------------

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = dmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
// `shared` holds 32 A. Warp sums in a fixed butterfly, then warp 0 adds the warp sums in order.
template <class A>
__device__ A block_sum(A v, A* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A s = lane < nwarps ? shared[lane] : A(0);
    s = warp_sum(s);
    if (lane == 0) shared[0] = s;
  }
  __syncthreads();
  return shared[0];
}

// Max over the block, like block_sum.
template <class A>
__device__ A block_max(A v, A* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A s = lane < nwarps ? shared[lane] : -A(INFINITY);
    s = warp_max(s);
    if (lane == 0) shared[0] = s;
  }
  __syncthreads();
  return shared[0];
}

// ---- launches ----------------------------------------------------------------------------------

// kernel<<<grid, block, smem, stream>>>(args...), then a check of the launch (a bad grid or
// shared-memory size throws here). A function rather than the raw syntax so that the CPU emulation
// (tests/cuda/emulation.h) runs the very same launchers.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch_kernel: wrong number of kernel arguments");
#ifdef AUTOSP_CUDA_EMULATION
  (void)stream;
  emulated_launch(grid, block, smem, reinterpret_cast<const void*>(kernel),
                  [&] { kernel(static_cast<Params>(args)...); });
#else
  kernel<<<grid, block, smem, stream>>>(static_cast<Params>(std::forward<Args>(args))...);
  CUDA_CHECK(cudaGetLastError());
#endif
}

// ---- launch sizes ------------------------------------------------------------------------------

// Blocks for a grid-stride loop over n items (capped: each thread then loops).
inline unsigned grid_for(int64_t n, int block) {
  const int64_t g = (n + block - 1) / block;
  return static_cast<unsigned>(g < 1 ? 1 : (g > (int64_t(1) << 20) ? (int64_t(1) << 20) : g));
}

#define AUTOSP_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

}  // namespace autosp::cuda

#endif  // __CUDACC__ || AUTOSP_CUDA_EMULATION
