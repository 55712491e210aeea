// CPU grouped expert MLP of a mixture-of-experts layer (Mixtral's, Qwen2-MoE's, Qwen3-MoE's sparse
// block; the ops moe_experts and moe_experts_backward), forward and backward over raw pointers.
// Knows nothing of graphs or tensors.
//
// x [R, C] (R = tokens, C = hidden), probs [R, E] (the router's softmax), and per expert e
// w_gate[e], w_up[e] [I, C], w_down[e] [C, I] (E experts of intermediate size I, nn.Linear layout,
// each its own tensor: the parameters as checkpoints hold them, never stacked into a copy):
//   y[r] = Σ_{e in topk(probs[r])} w_{r,e} · swiglu_e(x[r])                        [R, C]
// with the routing of kernels/moe_routing.h (dropless). Per expert, in chunks of kMlpChunkRows of its
// rows: gather them, the SwiGLU MLP's GEMMs on them (the dense matmul's gemm_batched) with the
// activation in one vectorised pass, then the weighted scatter-add into y, experts in index order
// (transformers' loop), so the sums do not depend on the thread count. With enough experts per
// thread they run side by side, one thread each, and each token's rows are summed afterwards in
// that same order: the same bits.
//
// gpt-oss's experts take kernels/kinds.h MoeOptions: per-expert biases (b_gate, b_up added to the
// projections before the activation, b_down to the expert's output, so the router's gradient
// dy · output includes dy · b_down) and the clamped SwiGLU. The backward writes the biases'
// gradients (each summed over the expert's rows, in double) where the options point.
#pragma once

#include <cstdint>

#include "kernels/kinds.h"

namespace autosp::cpu {

// One expert's parameters (biases null: none), for a backward the gradients it writes, and the
// activation: what the per-expert functions below take.
template <class T>
struct Expert {
  const T *wg = nullptr, *wu = nullptr, *wd = nullptr, *bg = nullptr, *bu = nullptr, *bd = nullptr;
  T *dwg = nullptr, *dwu = nullptr, *dwd = nullptr, *dbg = nullptr, *dbu = nullptr, *dbd = nullptr;
  bool clamped = false;
  double alpha = 1.702, limit = 7.0;
  // Expert e of the weight arrays and the options (its biases and bias gradients where they point).
  static Expert of(const T* const* w_gate, const T* const* w_up, const T* const* w_down,
                   const kernels::MoeOptions<T>& opt, int64_t e);
};

template <class T>
void moe_experts_forward(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                         const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                         const kernels::MoeOptions<T>& opt = {});

// dx [R, C], dprobs [R, E], per expert dw_gate[e], dw_up[e] [I, C], dw_down[e] [C, I] (overwritten). Each expert's
// gate and up projections are recomputed from x (seven GEMMs per expert); dprobs is moe_probs_grad of
// g = dy[r] · expert_e(x[r]), taken as (dy[r] · w_down[e]) · h (+ dy[r] · b_down[e]), so the
// expert's output is not rebuilt.
template <class T>
void moe_experts_backward(const T* dy, const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                          const T* const* w_down, T* dx, T* dprobs, T* const* dw_gate, T* const* dw_up,
                          T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                          const kernels::MoeOptions<T>& opt = {});

// The same pair keeping the gate and up projections from the forward for the backward (the op's
// runtime.moe_keep_projections: decisions 245, 253). kept [2, R·k, I]: moe_experts_forward_keeping writes there each
// assignment's gate projection (kept[0]) and up projection (kept[1]), biases included, at the
// assignment's place p in the routing (kernels/moe_routing.h: slot[p], expert after expert, each
// expert's rows in row order); moe_experts_backward_from_kept, given that block for the same x,
// probs and weights, reads them instead of recomputing (five GEMMs per expert instead of seven).
// The same bits as the pair above.
template <class T>
void moe_experts_forward_keeping(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                                 const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k,
                                 bool norm, const kernels::MoeOptions<T>& opt, T* kept);
template <class T>
void moe_experts_backward_from_kept(const T* dy, const T* x, const T* probs, const T* const* w_gate,
                                    const T* const* w_up, const T* const* w_down, T* dx, T* dprobs,
                                    T* const* dw_gate, T* const* dw_up, T* const* dw_down, int64_t R, int64_t C,
                                    int64_t E, int64_t I, int64_t k, bool norm, const kernels::MoeOptions<T>& opt,
                                    const T* kept);

// One expert on n rows held contiguously (expert parallelism's owner, engine/expert_parallel.h),
// by the same chunked code: y [n, C] += expert(x[a]) ...
template <class T>
void expert_rows_forward(const T* x, const Expert<T>& ex, T* y, int64_t n, int64_t C, int64_t I);
// ... and its backward: dx [n, C] += the rows' dx, g[a] = dy[a] · expert(x[a]) (the gradient of
// row a's routing weight), the expert's weight and bias gradients (overwritten); dy [n, C] is
// unweighted, w [n] the rows' routing weights.
template <class T>
void expert_rows_backward(const T* dy, const T* x, const double* w, const Expert<T>& ex, T* dx, double* g, int64_t n,
                          int64_t C, int64_t I);

// The expert's activation over one row of I f32 entries, as the kernels above run it (Expert<T>'s
// `clamped`, `alpha` and `limit`), for the bf16 kernel (kernels/cpu/moe_bf16.h) on gpt-oss's
// experts: h = act(g, u) (h may alias g) ...
void expert_activation_row(bool clamped, float alpha, float limit, const float* g, const float* u, float* h,
                           int64_t I);
// ... and its backward from d = dy·Wd (unweighted) of a row of routing weight w: g ← dg, u ← du
// (of w·d; zero where a clamp cut), h ← w·h; returns Σ d·h (the weight's gradient without the bias).
double expert_activation_grad_row(bool clamped, float alpha, float limit, float* g, float* u, const float* d,
                                  float* h, float w, int64_t I);

}  // namespace autosp::cpu
