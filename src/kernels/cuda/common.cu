// Definitions for common.cuh: the error reporting behind CUDA_CHECK / CUBLAS_CHECK and the
// stream-ordered scratch buffer. Knows nothing of graphs or tensors.
#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

namespace detail {

void throw_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  throw RuntimeFailure(
      str("CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err), " in ", expr, " at ", file, ":", line));
}

void throw_cublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw RuntimeFailure(
      str("cuBLAS error ", int(st), " (", cublasGetStatusString(st), ") in ", expr, " at ", file, ":", line));
}

}  // namespace detail

Scratch::Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes > 0) CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
}

Scratch::~Scratch() {
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);  // a destructor must not throw
}

}  // namespace autosp::cuda
