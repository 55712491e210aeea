// Expert parallelism's exchange (the moe_experts_ep and moe_experts_ep_backward ops, made by
// graph/passes/expert_parallel): a rank of an expert group of G ranks holds L = E / G of a layer's
// E experts (ep rank g: experts [g·L, (g+1)·L)) and its own tokens. Each call, on the CPU:
//
//   1. route locally: top-k of this rank's probabilities, as moe_experts (kernels/moe_routing.h);
//   2. counts first: every rank's rows per expert, [G, E], all-gathered over the group, so every
//      rank knows what each pair of ranks sends (a pair's rows: Σ over the receiver's experts);
//   3. payloads: one all-to-all of [G, M, width] (M = the largest pair's rows; shorter pairs are
//      padded), the rows to rank d being this rank's rows for d's experts, by expert then by row;
//   4. the owner runs each local expert (kernels/cpu/moe.h's per-expert code, gpt-oss's options
//      included: the owner applies the biases and the activation) on its rows from every source
//      (source rank order, then row order) and sends the results back the same way (a second
//      all-to-all);
//   5. the source weights and scatter-adds them, experts in index order, as moe_experts does.
//
// Forward: x rows go out, expert outputs come back; the routing weights never travel (the source
// applies them). Backward: [x | dy | w] rows go out (w the slot's routing weight); the owner runs
// the MoE kernel's seven-GEMM backward of the expert on them, its weight and bias gradients summed
// over every row it received (the expert group's tokens), and sends [dx | g] rows back, g = dy ·
// output the slot's weight gradient; the source forms the router's gradient from g
// (moe_probs_grad, exact as without EP) and adds dx. Knows nothing of graphs.
//
// Each direction is one message of rows whose parts keep their own types (decision 226's layout):
// x and dy travel in the tokens' type; the routing weight w, the expert's output, dx and g in the
// accumulation type (f32 for bf16 tokens), the types the one-process kernel holds them in. So in
// bf16 (moe_ep_*_bf16: the owner runs kernels/cpu/moe_bf16.h's ExpertBf16, the one-process bf16
// kernel's per-expert code) E > 1 and one process round alike and differ only by the order of f32
// sums (decision 264).
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "kernels/cpu/matmul.h"  // Bf16Gemm
#include "kernels/kinds.h"
#include "tensor/allocator.h"

namespace autosp {

// x, y [R, C], probs [R, E]; w_gate[j], w_up[j] [I, C], w_down[j] [C, I] for this rank's L local
// experts (E = L · ep.size()), and the options' biases likewise.
template <class T>
void moe_ep_forward(Communicator& ep, Allocator& alloc, const T* x, const T* probs, const T* const* w_gate,
                    const T* const* w_up, const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I,
                    int64_t k, bool norm, const kernels::MoeOptions<T>& opt);

// dx [R, C], dprobs [R, E], dw_*[j] the local experts' weight gradients and opt.db_*[j] their
// biases' (overwritten).
template <class T>
void moe_ep_backward(Communicator& ep, Allocator& alloc, const T* dy, const T* x, const T* probs,
                     const T* const* w_gate, const T* const* w_up, const T* const* w_down, T* dx, T* dprobs,
                     T* const* dw_gate, T* const* dw_up, T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I,
                     int64_t k, bool norm, const kernels::MoeOptions<T>& opt);

// The same on bf16 bits (uint16_t), every GEMM on the bf16 GEMM `path` (the owner runs
// kernels/cpu/moe_bf16.h's ExpertBf16, gpt-oss's options included: biases, clamped SwiGLU).
void moe_ep_forward_bf16(Communicator& ep, Allocator& alloc, cpu::Bf16Gemm path, const uint16_t* x,
                         const uint16_t* probs, const uint16_t* const* w_gate, const uint16_t* const* w_up,
                         const uint16_t* const* w_down, uint16_t* y, int64_t R, int64_t C, int64_t E, int64_t I,
                         int64_t k, bool norm, const kernels::MoeOptions<uint16_t>& opt = {});
void moe_ep_backward_bf16(Communicator& ep, Allocator& alloc, cpu::Bf16Gemm path, const uint16_t* dy,
                          const uint16_t* x, const uint16_t* probs, const uint16_t* const* w_gate,
                          const uint16_t* const* w_up, const uint16_t* const* w_down, uint16_t* dx, uint16_t* dprobs,
                          uint16_t* const* dw_gate, uint16_t* const* dw_up, uint16_t* const* dw_down, int64_t R,
                          int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                          const kernels::MoeOptions<uint16_t>& opt = {});

}  // namespace autosp
