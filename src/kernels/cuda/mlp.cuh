// CUDA tiled SwiGLU MLP, forward and backward, over device pointers: kernels/cpu/mlp.h's chunks
// and steps, each chunk of rows as cuBLASLt GEMMs and elementwise launches on [chunk, I] scratch
// (four buffers: the CPU fuses the gradient's elementwise steps, here they are separate launches).
// Knows nothing of graphs or tensors; the engine's launcher allocates the scratch.
//
// x, y, dy, dx [R, C]; w_gate, w_up [I, C]; w_down [C, I]. T is float, double or bf16.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matmul.cuh"

namespace autosp::cuda {

// y = (silu(x·w_gateᵀ) ∘ (x·w_upᵀ))·w_downᵀ. g, u: scratch [min(R, chunk), I].
template <class T>
void swiglu_mlp(const T* x, const T* w_gate, const T* w_up, const T* w_down, T* y, int64_t R, int64_t C, int64_t I,
                int64_t chunk, T* g, T* u, cudaStream_t stream);

// dx, and dw_gate, dw_up, dw_down (overwritten), summed over the chunks. scratch: four buffers of
// [min(R, chunk), I]; acc: swiglu_mlp_acc_elems<T>(C, I) floats (bf16: the weight gradients' f32
// sums, ChunkedGradient), null when that is 0.
template <class T>
void swiglu_mlp_backward(const T* dy, const T* x, const T* w_gate, const T* w_up, const T* w_down, T* dx, T* dw_gate,
                         T* dw_up, T* dw_down, int64_t R, int64_t C, int64_t I, int64_t chunk, T* const (&scratch)[4],
                         float* acc, cudaStream_t stream);

template <class T>
int64_t swiglu_mlp_acc_elems(int64_t C, int64_t I) {
  return 3 * ChunkedGradient<T>::acc_elems(I, C);
}

}  // namespace autosp::cuda
