// The CPU grouped expert MLP (kernels/cpu/moe.h) on bf16 tensors, with every GEMM on the CPU's bf16
// GEMM `path` (kernels/cpu/matmul.h gemm_bf16_batched: bf16 pairs, f32 accumulation): Mixtral's,
// Qwen2-MoE's and Qwen3-MoE's experts (plain SwiGLU, no biases) and gpt-oss's (kernels/kinds.h
// MoeOptions: per-expert biases, the clamped SwiGLU). Knows nothing of graphs or tensors.
//
// x, y, dy, dx [R, C], probs and dprobs [R, E], and per expert w_gate[e], w_up[e] [I, C],
// w_down[e] [C, I] (and the options' b_gate[e], b_up[e] [I], b_down[e] [C]), all bf16 bits
// (uint16_t). The routing is kernels/moe_routing.h's on the probabilities widened to f32 (what the
// emulation routes on). Per expert, in chunks of kMlpChunkRows of its rows, as the tiled MLP's bf16
// kernel (kernels/cpu/mlp.h) does for every row: the gate and up projections and d = dy·Wd in f32,
// what a GEMM reads rounded to bf16 once (h, w·h, dg, du), the expert's outputs and dx rows added
// into f32 sums per token, experts in index order (transformers' loop, the f32 kernel's order), and
// the weight gradients summed over the chunks in f32; every output is rounded once at the end. No
// f32 copy of the experts' weights is made (the emulation widens every expert of the layer whole).
//
// gpt-oss's options as the f32 kernel applies them (kernels/cpu/moe.cpp): the biases, widened to
// f32, added to the GEMMs' f32 outputs (b_gate, b_up before the activation, b_down to the expert's
// output, so a slot's weight gradient dy · output includes dy · b_down); the activation the f32
// kernel's own rows (moe.h expert_activation_row: the clamped SwiGLU with its alpha and limit); the
// bias gradients (Σ dg, Σ du, Σ w·dy over the expert's rows) summed in double and rounded once.
// Plain experts run exactly the code they ran before.
//
// ExpertBf16 is one expert's part of that on rows already gathered, which the expert-parallel owner
// (engine/expert_parallel.cpp) runs on the rows it receives: the same roundings, so E > 1 and one
// process differ only by the order of f32 sums.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/matmul.h"  // Bf16Gemm
#include "kernels/cpu/moe.h"     // Expert
#include "kernels/kinds.h"       // MoeOptions
#include "kernels/moe_routing.h"

namespace autosp::cpu {

// The routing of bf16 probs [R, E]: kernels/moe_routing.h's on the probabilities widened to f32
// (exact), as the emulation routes.
kernels::MoeRouting moe_route_bf16(const uint16_t* probs, int64_t R, int64_t E, int64_t k, bool norm);

// dprobs [R, E] (bf16) from g [R·k] (each slot's weight gradient): moe_probs_grad in f32, rounded once.
void moe_probs_grad_bf16(const kernels::MoeRouting& r, bool norm, const double* g, uint16_t* dprobs);

// One expert (cpu::Expert on bf16 bits: its weights, its biases and their gradients where they
// point, its activation) on chunks of n ≤ `rows` (≤ kMlpChunkRows) gathered rows, with scratch for them.
using ExpertBits = Expert<uint16_t>;
class ExpertBf16 {
 public:
  ExpertBf16(Bf16Gemm path, int64_t rows, int64_t C, int64_t I);
  // ye [n, C] (f32, unweighted) = the expert's output on xe [n, C]; h rounded to bf16 for the down GEMM.
  void forward(const ExpertBits& ex, const uint16_t* xe, int64_t n, float* ye);
  // The backward of n rows: xe, dye [n, C] (dy unweighted), w [n] their routing weights (f32) →
  // grad[a] = dy · the row's output in double (the weight's gradient: Σ d·h, + dy · b_down), dxe
  // [n, C] (f32), and the weight (and bias) gradients' sums (`first`: overwritten, else added to);
  // w·h, dg and du rounded to bf16 for the GEMMs.
  void backward(const ExpertBits& ex, const uint16_t* xe, const uint16_t* dye, const float* w, int64_t n, bool first,
                double* grad, float* dxe);
  // The gradients' sums rounded into ex.dwg, ex.dwu [I, C], ex.dwd [C, I] (and ex.dbg, ex.dbu [I],
  // ex.dbd [C] where the expert has biases).
  void finish(const ExpertBits& ex) const;

 private:
  // Whether ex runs gpt-oss's options (else the plain SwiGLU, as before them).
  static bool options(const ExpertBits& ex) { return ex.bg != nullptr || ex.clamped; }
  // ex's biases widened into bg_, bu_, bd_ once per expert (an expert without biases: none), and
  // g, u [n, I] += bg_, bu_.
  void add_biases(const ExpertBits& ex, int64_t n);
  Bf16Gemm path_;
  int64_t C_, I_;
  std::vector<float> g_, u_, d_, h_, dwg_, dwu_, dwd_, bg_, bu_, bd_;
  std::vector<uint16_t> h16_, dg16_, du16_;
  std::vector<double> dbg_, dbu_, dbd_;
  // The expert whose biases bg_, bu_, bd_ hold (its b_gate; null: none yet). An object lives for one
  // kernel call, in which the weights do not change, so an expert's chunks widen them once.
  const uint16_t* widened_ = nullptr;
};

void moe_experts_forward_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* probs, const uint16_t* const* w_gate,
                              const uint16_t* const* w_up, const uint16_t* const* w_down, uint16_t* y, int64_t R,
                              int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                              const kernels::MoeOptions<uint16_t>& opt = {});

// dx [R, C]; dprobs [R, E] (the routing weights' gradient through top-k and `norm`); the weight
// gradients dw_gate[e], dw_up[e], dw_down[e] and the options' db_gate[e], db_up[e], db_down[e]
// (overwritten; zeros for an expert no row reached).
void moe_experts_backward_bf16(Bf16Gemm path, const uint16_t* dy, const uint16_t* x, const uint16_t* probs,
                               const uint16_t* const* w_gate, const uint16_t* const* w_up,
                               const uint16_t* const* w_down, uint16_t* dx, uint16_t* dprobs,
                               uint16_t* const* dw_gate, uint16_t* const* dw_up, uint16_t* const* dw_down, int64_t R,
                               int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                               const kernels::MoeOptions<uint16_t>& opt = {});

// Expert ex's gradients zero (an expert no row reached): its weights', and its biases' where it has them.
void zero_expert_grads_bf16(const ExpertBits& ex, int64_t C, int64_t I);

}  // namespace autosp::cpu
