// The launchers of the kernel dispatch table's two columns (engine/dispatch.cpp): one per op, the
// same list for both devices, declared once below for cpu_ops (engine/cpu/launchers.cpp, the
// reference) and cuda_ops (engine/cuda/launchers.cpp, compiled only in CUDA builds), so the CUDA
// launchers mirror the CPU ones name for name. A launcher maps the op's tensors onto the kernels of
// src/kernels/cpu or src/kernels/cuda; each .cpp says what is particular to its device (dtypes,
// streams, bf16). An op with no CUDA kernel would be declared for cpu_ops alone and get `no_cuda`
// in the table.
#pragma once

#include "engine/dispatch.h"
#include "kernels/kinds.h"  // the Binary, Unary and UnaryGrad kinds the templates take; RopeScaling

namespace autosp {
// A rope node's rope_scaling attributes (Builder::rope; none when absent) for either device's kernel.
inline kernels::RopeScaling rope_scaling_of(const Node& n) {
  kernels::RopeScaling s;
  if (!n.attrs().has("rope_type")) return s;
  const std::string& type = n.attrs().s("rope_type");
  AUTOSP_ASSERT(type == "linear" || type == "llama3" || type == "yarn", "rope_type ", type);
  s.kind = type == "linear" ? kernels::RopeScaling::linear
           : type == "llama3" ? kernels::RopeScaling::llama3
                              : kernels::RopeScaling::yarn;
  s.factor = n.attrs().f("factor");
  if (s.kind == kernels::RopeScaling::llama3) {
    s.low_freq_factor = n.attrs().f("low_freq_factor");
    s.high_freq_factor = n.attrs().f("high_freq_factor");
    s.original_max_position_embeddings = n.attrs().f("original_max_position_embeddings");
  }
  if (s.kind == kernels::RopeScaling::yarn) {  // models/model.cpp with_rope_scaling resolves HF's defaults
    s.original_max_position_embeddings = n.attrs().f("original_max_position_embeddings");
    s.beta_fast = n.attrs().f("beta_fast");
    s.beta_slow = n.attrs().f("beta_slow");
    s.attention_factor = n.attrs().f("attention_factor");
    s.mscale = n.attrs().f("mscale");
    s.mscale_all_dim = n.attrs().f("mscale_all_dim");
    s.truncate = n.attrs().f("truncate") != 0;
  }
  return s;
}
}  // namespace autosp

// clang-format off
#define AUTOSP_DECLARE_LAUNCHERS                                                         \
  Tensor embedding(const KernelCall& c);                                                 \
  Tensor matmul(const KernelCall& c);                                                    \
  template <kernels::Binary kOp> Tensor binary(const KernelCall& c);                         \
  template <kernels::Unary kOp> Tensor unary(const KernelCall& c);                           \
  Tensor reshape(const KernelCall& c);                                                   \
  Tensor permute(const KernelCall& c); /* transpose and permute */                       \
  Tensor slice(const KernelCall& c);                                                     \
  Tensor concat(const KernelCall& c);                                                    \
  Tensor layernorm(const KernelCall& c);                                                 \
  Tensor rmsnorm(const KernelCall& c);                                                   \
  Tensor softmax(const KernelCall& c);                                                   \
  template <bool kBackward> Tensor rope(const KernelCall& c);                            \
  Tensor sdpa(const KernelCall& c);                                                      \
  Tensor cross_entropy_sum(const KernelCall& c);                                         \
  Tensor count_valid(const KernelCall& c);                                               \
  Tensor full(const KernelCall& c);                                                      \
  Tensor causal_mask(const KernelCall& c);                                               \
  Tensor all_to_all(const KernelCall& c);                                                \
  Tensor all_reduce(const KernelCall& c);                                                \
  Tensor all_gather(const KernelCall& c);                                                \
  Tensor reduce_scatter(const KernelCall& c);                                            \
  Tensor ring_attention(const KernelCall& c);                                            \
  Tensor ring_attention_backward(const KernelCall& c);                                   \
  Tensor sum_to(const KernelCall& c);                                                    \
  Tensor embedding_backward(const KernelCall& c);                                        \
  template <kernels::UnaryGrad kOp> Tensor unary_backward(const KernelCall& c);              \
  Tensor slice_backward(const KernelCall& c);                                            \
  Tensor layernorm_backward(const KernelCall& c);                                        \
  Tensor rmsnorm_backward(const KernelCall& c);                                          \
  Tensor softmax_backward(const KernelCall& c);                                          \
  Tensor sdpa_backward(const KernelCall& c);                                             \
  Tensor cross_entropy_backward(const KernelCall& c);                                    \
  Tensor cast(const KernelCall& c);                                                      \
  Tensor add_layernorm(const KernelCall& c);                                             \
  Tensor add_rmsnorm(const KernelCall& c);                                               \
  Tensor bias_gelu_tanh(const KernelCall& c);                                            \
  Tensor bias_gelu_tanh_backward(const KernelCall& c);                                   \
  Tensor swiglu_mlp(const KernelCall& c);                                                \
  Tensor swiglu_mlp_backward(const KernelCall& c);                                       \
  Tensor linear_cross_entropy_sum(const KernelCall& c);                                  \
  Tensor linear_cross_entropy_backward(const KernelCall& c);

// The template rows of the dispatch table, instantiated by each launcher file after its
// definitions (one list for both).
#define AUTOSP_INSTANTIATE_LAUNCHERS                                                     \
  template Tensor binary<kernels::Binary::add>(const KernelCall&);                           \
  template Tensor binary<kernels::Binary::sub>(const KernelCall&);                           \
  template Tensor binary<kernels::Binary::mul>(const KernelCall&);                           \
  template Tensor binary<kernels::Binary::div>(const KernelCall&);                           \
  template Tensor unary<kernels::Unary::scale>(const KernelCall&);                           \
  template Tensor unary<kernels::Unary::neg>(const KernelCall&);                             \
  template Tensor unary<kernels::Unary::exp>(const KernelCall&);                             \
  template Tensor unary<kernels::Unary::gelu_tanh>(const KernelCall&);                       \
  template Tensor unary<kernels::Unary::silu>(const KernelCall&);                            \
  template Tensor unary_backward<kernels::UnaryGrad::gelu_tanh>(const KernelCall&);          \
  template Tensor unary_backward<kernels::UnaryGrad::silu>(const KernelCall&);               \
  template Tensor rope<false>(const KernelCall&);                                        \
  template Tensor rope<true>(const KernelCall&);
// clang-format on

namespace autosp::cpu_ops {
AUTOSP_DECLARE_LAUNCHERS

// bf16 on the CPU is emulated: whether `c` runs through bf16_via_f32 (its op computes, ops.h:
// Numerics::computes, and a bf16 tensor is among its inputs or its output), and `f32_launcher` on
// `c`'s inputs widened to f32, each result rounded once to its node's dtype and placed where the
// memory plan put it: the numerics of the CUDA kernels (f32 compute, one rounding per result), not
// their speed.
bool emulates_bf16(const KernelCall& c);
Tensor bf16_via_f32(const KernelCall& c, KernelFn f32_launcher);

// The CPU sdpa_backward's partial dK, dV (kernels/cpu/attention.h), in bytes of its compute type
// (f32 for bf16 nodes, which run through bf16_via_f32).
size_t sdpa_backward_workspace(const Node& n, const Bindings& b);

// The [rows, V] logits chunk the tiled head + loss wants as workspace (kernels/cpu/loss.h), in
// bytes of its compute type.
size_t linear_cross_entropy_workspace(const Node& n, const Bindings& b);
}  // namespace autosp::cpu_ops

namespace autosp::cuda_ops {
AUTOSP_DECLARE_LAUNCHERS
}  // namespace autosp::cuda_ops

#undef AUTOSP_DECLARE_LAUNCHERS  // AUTOSP_INSTANTIATE_LAUNCHERS stays for the two launcher files
