// CUDA grouped expert MLP of a mixture-of-experts layer (kernels/cpu/moe.h's contract and steps):
// the routing is computed on the host (kernels/moe_routing.h) from the router probabilities copied
// back, so each call synchronises its stream once; then per expert and chunk of its rows a gather
// kernel, cuBLASLt GEMMs with the activation in one kernel, and a weighted scatter-add kernel; the
// backward takes seven GEMMs per expert, as the CPU's does. Simple and correct rather than fast (a
// grouped GEMM over all experts and on-device routing are left for later).
// Knows nothing of graphs or tensors.
//
// x, y, dy, dx [R, C]; probs, dprobs [R, E]; per expert e (host arrays of device pointers)
// w_gate[e], w_up[e] [I, C], w_down[e] [C, I] and their gradients. T is float, double or bf16.
// gpt-oss's options (kernels/kinds.h MoeOptions: per-expert biases, the clamped SwiGLU) as on the
// CPU; the biases' gradients are summed over the expert's rows in acc_t<T> (decision 221).
//
// Below them, the pieces they are made of, which expert parallelism's exchange on device buffers
// (engine/cuda/expert_parallel.cpp) runs too: the host routing, the per-expert code on a list of
// rows, and the row gather and scatter-add.
#pragma once

#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/kinds.h"
#include "kernels/moe_routing.h"

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

// ---- the pieces (every pointer a device pointer unless it says host) ----

// The routing of probs [R, E], computed on the host from a copy (one stream synchronisation; bf16
// routes in float), as moe_experts does.
template <class T>
kernels::MoeRouting moe_route(const T* probs, int64_t R, int64_t E, int64_t k, bool norm, cudaStream_t stream);

// A routing's slots and weights (acc_t<T>) uploaded.
template <class T>
struct DeviceRouting {
  Scratch slot, weight;
  DeviceRouting(const kernels::MoeRouting& r, cudaStream_t stream);
  const int64_t* slots() const { return slot.as<int64_t>(); }
  const acc_t<T>* weights() const { return weight.as<acc_t<T>>(); }
};

// The rows a list of experts runs on: expert j's are slot[offset[j]] .. slot[offset[j + 1] - 1]
// (offset on the host, one more than the experts), each reading row slot[a] / k of its inputs and
// weighted by weight[slot[a]] (null: 1). An expert's slots name distinct rows.
template <class T>
struct MoeRows {
  const int64_t* slot;
  const std::vector<int64_t>* offset;
  int64_t k;
  const acc_t<T>* weight;
};

// y row slot[a] / k += weight · (expert j's output on x's row, b_down included), experts in index
// order (y is not zeroed); w_*[j] expert j's weights, opt's biases likewise.
template <class T>
void moe_rows_forward(const T* x, const MoeRows<T>& rows, const T* const* w_gate, const T* const* w_up,
                      const T* const* w_down, T* y, int64_t C, int64_t I, const kernels::MoeOptions<T>& opt,
                      cudaStream_t stream);

// The backward of moe_rows_forward with the weight applied (the seven GEMMs; rows.weight is
// required here): dx rows += (not zeroed), grad[slot[a]] = the gradient of the slot's weight,
// dw_*[j] and opt.db_*[j] overwritten (zeros for an expert without rows).
template <class T>
void moe_rows_backward(const T* dy, const T* x, const MoeRows<T>& rows, const T* const* w_gate, const T* const* w_up,
                       const T* const* w_down, T* dx, acc_t<T>* grad, T* const* dw_gate, T* const* dw_up,
                       T* const* dw_down, int64_t C, int64_t I, const kernels::MoeOptions<T>& opt,
                       cudaStream_t stream);

// dst [n, C] row a = src row slot[a] / k, zeros where slot[a] < 0.
template <class V>
void moe_gather_rows(const V* src, const int64_t* slot, V* dst, int64_t n, int64_t C, int64_t k, cudaStream_t stream);

// dst row slot[a] / k += weight[slot[a]] · src row a (weight null: 1); the n slots name distinct rows.
template <class T>
void moe_scatter_add_rows(const T* src, const int64_t* slot, const acc_t<T>* weight, T* dst, int64_t n, int64_t C,
                          int64_t k, cudaStream_t stream);

// dprobs [R, E] from each slot's weight gradient grad [R·k] (kernels/moe_routing.h moe_probs_grad,
// on the host: the stream is synchronised).
template <class T>
void moe_probs_grad(const kernels::MoeRouting& r, bool norm, const acc_t<T>* grad, T* dprobs, cudaStream_t stream);

}  // namespace autosp::cuda
