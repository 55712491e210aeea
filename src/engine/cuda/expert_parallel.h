// Expert parallelism's exchange on CUDA (the moe_experts_ep ops of engine/cuda/launchers.cpp): the
// steps of engine/expert_parallel.h on device buffers. Routing on the host from the probabilities
// copied back (kernels/cuda/moe.cuh moe_route: one stream synchronisation, as moe_experts); the
// [G, E] counts all-gathered through the group's communicator as a device tensor (NCCL on a CUDA
// job) and copied back (a second synchronisation); the send buffer [G, M, width] packed by a
// gather kernel (the rows by a slot list, -1 for padding); the payload all-to-alls on device
// memory; the local experts through the CUDA MoE kernel's own per-expert code (moe_rows_forward /
// _backward: the seven-GEMM backward, gpt-oss's biases and clamped SwiGLU alike) on the received
// rows by a row list; and the source's weighted scatter-add, one launch per expert in index order
// as moe_experts. Forward: x rows out, expert outputs (b_down added) back, weighted at the source.
// Backward: x, dy and the slot's routing weight out (three all-to-alls: the weight travels in
// acc_t<T>, so bf16's is not rounded), dx and the weight's gradient g back (two); the source forms
// the router's gradient from g on the host (moe_probs_grad). All pointers are device pointers; the
// buffers come from `alloc` (the device's); every kernel goes on `stream`. T: float, double, bf16.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "comm/communicator.h"
#include "kernels/cuda/common.cuh"
#include "kernels/kinds.h"
#include "tensor/allocator.h"

namespace autosp::cuda {

// x, y [R, C], probs [R, E]; w_gate[j], w_up[j] [I, C], w_down[j] [C, I] for this rank's L local
// experts (E = L · ep.size()), and the options' biases likewise.
template <class T>
void moe_ep_forward(Communicator& ep, Allocator& alloc, const T* x, const T* probs, const T* const* w_gate,
                    const T* const* w_up, const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I,
                    int64_t k, bool norm, const kernels::MoeOptions<T>& opt, cudaStream_t stream);

// dx [R, C], dprobs [R, E], dw_*[j] the local experts' weight gradients and opt.db_*[j] their
// biases' (overwritten; an expert no row reached gets zeros).
template <class T>
void moe_ep_backward(Communicator& ep, Allocator& alloc, const T* dy, const T* x, const T* probs,
                     const T* const* w_gate, const T* const* w_up, const T* const* w_down, T* dx, T* dprobs,
                     T* const* dw_gate, T* const* dw_up, T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I,
                     int64_t k, bool norm, const kernels::MoeOptions<T>& opt, cudaStream_t stream);

}  // namespace autosp::cuda
