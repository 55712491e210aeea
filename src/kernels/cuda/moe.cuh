// CUDA grouped expert MLP of a mixture-of-experts layer (kernels/cpu/moe.h's contract and steps):
// the routing is computed on the host (kernels/moe_routing.h) from the router probabilities copied
// back, so each call synchronises its stream once; then per expert and chunk of its rows a gather
// kernel, cuBLASLt GEMMs with the activation in one kernel, and a weighted scatter-add kernel; the
// backward takes seven GEMMs per expert, as the CPU's does. Simple and correct rather than fast (a
// grouped GEMM over all experts, on-device routing and expert parallelism are left for later).
// Knows nothing of graphs or tensors.
//
// x, y, dy, dx [R, C]; probs, dprobs [R, E]; per expert e (host arrays of device pointers)
// w_gate[e], w_up[e] [I, C], w_down[e] [C, I] and their gradients. T is float, double or bf16.
// gpt-oss's options (kernels/kinds.h MoeOptions: per-expert biases, the clamped SwiGLU) as on the
// CPU; the biases' gradients are summed over the expert's rows in acc_t<T> (decision 221).
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/kinds.h"

namespace autosp::cuda {

template <class T>
void moe_experts_forward(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                         const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                         const kernels::MoeOptions<T>& opt, cudaStream_t stream);

template <class T>
void moe_experts_backward(const T* dy, const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                          const T* const* w_down, T* dx, T* dprobs, T* const* dw_gate, T* const* dw_up,
                          T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                          const kernels::MoeOptions<T>& opt, cudaStream_t stream);

}  // namespace autosp::cuda
