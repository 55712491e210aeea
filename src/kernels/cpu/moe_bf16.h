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
//
// ExpertBf16 is one expert's part of that on rows already gathered, which the expert-parallel owner
// (engine/expert_parallel.cpp) runs on the rows it receives: the same roundings, so E > 1 and one
// process differ only by the order of f32 sums.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/matmul.h"  // Bf16Gemm
#include "kernels/moe_routing.h"

namespace autosp::cpu {

// The routing of bf16 probs [R, E]: kernels/moe_routing.h's on the probabilities widened to f32
// (exact), as the emulation routes.
kernels::MoeRouting moe_route_bf16(const uint16_t* probs, int64_t R, int64_t E, int64_t k, bool norm);

// dprobs [R, E] (bf16) from g [R·k] (each slot's weight gradient): moe_probs_grad in f32, rounded once.
void moe_probs_grad_bf16(const kernels::MoeRouting& r, bool norm, const double* g, uint16_t* dprobs);

// One expert's SwiGLU MLP on chunks of n ≤ `rows` (≤ kMlpChunkRows) gathered rows, with scratch for
// them; the weights are the expert's w_gate, w_up [I, C] and w_down [C, I].
class ExpertBf16 {
 public:
  ExpertBf16(Bf16Gemm path, int64_t rows, int64_t C, int64_t I);
  // ye [n, C] (f32, unweighted) = the expert's output on xe [n, C]; h rounded to bf16 for the down GEMM.
  void forward(const uint16_t* wg, const uint16_t* wu, const uint16_t* wd, const uint16_t* xe, int64_t n, float* ye);
  // The backward of n rows: xe, dye [n, C] (dy unweighted), w [n] their routing weights (f32) →
  // grad[a] = Σ d·h in double (the weight's gradient), dxe [n, C] (f32), and the weight gradients'
  // f32 sums (`first`: overwritten, else added to); w·h, dg and du rounded to bf16 for the GEMMs.
  void backward(const uint16_t* wg, const uint16_t* wu, const uint16_t* wd, const uint16_t* xe, const uint16_t* dye,
                const float* w, int64_t n, bool first, double* grad, float* dxe);
  // The weight gradients' sums rounded into dwg, dwu [I, C] and dwd [C, I].
  void finish(uint16_t* dwg, uint16_t* dwu, uint16_t* dwd) const;

 private:
  Bf16Gemm path_;
  int64_t C_, I_;
  std::vector<float> g_, u_, d_, h_, dwg_, dwu_, dwd_;
  std::vector<uint16_t> h16_, dg16_, du16_;
};

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
