// Scratch for the CPU emulation of the CUDA kernels (emulation.h): host memory from malloc, in
// place of common.cu's stream-ordered device allocations.
#include <cstdlib>

#include "cuda/emulation.h"
#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

Scratch::Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes > 0) ptr_ = std::malloc(bytes);
}

Scratch::~Scratch() { std::free(ptr_); }

}  // namespace autosp::cuda
