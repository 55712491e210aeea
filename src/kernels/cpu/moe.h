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
// (transformers' loop), so the sums do not depend on the thread count.
#pragma once

#include <cstdint>

namespace autosp::cpu {

template <class T>
void moe_experts_forward(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                         const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm);

// dx [R, C], dprobs [R, E], per expert dw_gate[e], dw_up[e] [I, C], dw_down[e] [C, I] (overwritten). Each expert's
// gate and up projections are recomputed from x (seven GEMMs per expert); dprobs is moe_probs_grad of
// g = dy[r] · swiglu_e(x[r]), taken as (dy[r] · w_down[e]) · h, so the expert's output is not rebuilt.
template <class T>
void moe_experts_backward(const T* dy, const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                          const T* const* w_down, T* dx, T* dprobs, T* const* dw_gate, T* const* dw_up,
                          T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm);

}  // namespace autosp::cpu
