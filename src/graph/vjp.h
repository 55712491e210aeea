// The vjp rules of the op table (defined in vjp.cpp): each builds the gradient of a node's inputs
// as IR from the gradient of its output. Internal to src/graph; the op table points at them.
#pragma once

#include "graph/ops.h"

namespace autosp::vjp {

void embedding(VjpContext&);
void matmul(VjpContext&);
void add(VjpContext&);
void sub(VjpContext&);
void mul(VjpContext&);
void div(VjpContext&);
void scale(VjpContext&);
void dropout(VjpContext&);
void neg(VjpContext&);
void exp(VjpContext&);
void tanh(VjpContext&);
void gelu_tanh(VjpContext&);
void silu(VjpContext&);
void reshape(VjpContext&);
void transpose(VjpContext&);
void permute(VjpContext&);
void slice(VjpContext&);
void concat(VjpContext&);
void layernorm(VjpContext&);
void rmsnorm(VjpContext&);
void softmax(VjpContext&);
void rope(VjpContext&);
void sdpa(VjpContext&);
void ring_attention(VjpContext&);
void cross_entropy_sum(VjpContext&);
void causal_mask(VjpContext&);
void all_to_all(VjpContext&);
void all_reduce(VjpContext&);
void all_gather(VjpContext&);
void reduce_scatter(VjpContext&);
void cast(VjpContext&);
void add_layernorm(VjpContext&);
void qkv_heads(VjpContext&);
void add_rmsnorm(VjpContext&);
void bias_gelu_tanh(VjpContext&);
void swiglu(VjpContext&);
void swiglu_mlp(VjpContext&);
void moe_experts(VjpContext&);
void moe_experts_ep(VjpContext&);
void linear_cross_entropy_sum(VjpContext&);
void sequence_logps(VjpContext&);
void dpo_loss(VjpContext&);
void moe_router_stats(VjpContext&);
void moe_aux_loss(VjpContext&);
void no_gradient(VjpContext&);  // count_valid, full: nothing flows to the inputs

}  // namespace autosp::vjp
