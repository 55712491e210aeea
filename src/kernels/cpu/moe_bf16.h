// The CPU grouped expert MLP (kernels/cpu/moe.h) on bf16 tensors, with every GEMM on the CPU's bf16
// GEMM `path` (kernels/cpu/matmul.h gemm_bf16_batched: bf16 pairs, f32 accumulation): Mixtral's,
// Qwen2-MoE's and Qwen3-MoE's experts (plain SwiGLU, no biases; gpt-oss's biased, clamped experts
// stay on the emulation). Knows nothing of graphs or tensors.
//
// x, y, dy, dx [R, C], probs and dprobs [R, E], and per expert w_gate[e], w_up[e] [I, C],
// w_down[e] [C, I], all bf16 bits (uint16_t). The routing is kernels/moe_routing.h's on the
// probabilities widened to f32 (what the emulation routes on). Per expert, in chunks of
// kMlpChunkRows of its rows, as the tiled MLP's bf16 kernel (kernels/cpu/mlp.h) does for every row:
// the gate and up projections and d = dy·Wd in f32, what a GEMM reads rounded to bf16 once (h,
// w·h, dg, du), the expert's outputs and dx rows added into f32 sums per token, experts in index
// order (transformers' loop, the f32 kernel's order), and the weight gradients summed over the
// chunks in f32; every output is rounded once at the end. No f32 copy of the experts' weights is
// made (the emulation widens every expert of the layer whole).
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"  // Bf16Gemm

namespace autosp::cpu {

void moe_experts_forward_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* probs, const uint16_t* const* w_gate,
                              const uint16_t* const* w_up, const uint16_t* const* w_down, uint16_t* y, int64_t R,
                              int64_t C, int64_t E, int64_t I, int64_t k, bool norm);

// dx [R, C]; dprobs [R, E] (the routing weights' gradient through top-k and `norm`); the weight
// gradients dw_gate[e], dw_up[e], dw_down[e] (overwritten; zeros for an expert no row reached).
void moe_experts_backward_bf16(Bf16Gemm path, const uint16_t* dy, const uint16_t* x, const uint16_t* probs,
                               const uint16_t* const* w_gate, const uint16_t* const* w_up,
                               const uint16_t* const* w_down, uint16_t* dx, uint16_t* dprobs,
                               uint16_t* const* dw_gate, uint16_t* const* dw_up, uint16_t* const* dw_down, int64_t R,
                               int64_t C, int64_t E, int64_t I, int64_t k, bool norm);

}  // namespace autosp::cpu
