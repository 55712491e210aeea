// A mixture-of-experts MLP (Mixtral's MixtralSparseMoeBlock, Qwen2-MoE's and Qwen3-MoE's
// Qwen2MoeSparseMoeBlock) recorded into a Llama-layout graph (models/model.cpp calls it for the
// layers ModelConfig::sparse_layer names). Shapes: B, S, C (hidden), E (experts), I (expert width).
// Knows nothing of kernels or configs beyond ModelConfig.
//
//   probs = softmax(f32(x · routerᵀ))                 [B, S, E]  (the router in f32, as transformers)
//   y     = moe_experts(x, probs, w_gate, w_up, w_down)          (top-k, dropless; graph/ops.h)
//   gpt-oss: the router's logits + bias [E]; each expert's projections with biases and the clamped
//   SwiGLU (MoeExpertOptions: swiglu_limit, swiglu_alpha); top-k always renormalised (decision 201)
//   Qwen2-MoE: y += sigmoid(x · shared_expert_gateᵀ) ∘ shared_expert(x)
//
// The experts' parameters keep Hugging Face's per-expert names and shapes ([I, C] and [C, I]), so
// checkpoints, the loader, ZeRO and the optimizer see ordinary tensors, and moe_experts takes them
// as they are (3E inputs): no stacked copy of the experts is ever made or kept for the backward.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "models/model_config.h"

namespace autosp {

struct MoeBlock {
  Node* y;      // [B, S, C]
  Node* probs;  // the router's probabilities in f32 [B, S, E] (the load-balancing loss reads them)
};

// Creates a parameter of the given name and shape (the builder's own, in its order and dtype).
using MakeParam = std::function<Node*(const std::string& name, SymShape shape)>;

// The sparse MLP of the layer whose parameters are named under `layer` ("model.layers.3."), over
// x [B, S, C] (the post-attention norm's output).
MoeBlock moe_block(Builder& b, const ModelConfig& m, const std::string& layer, Node* x, const MakeParam& p);

// The load-balancing loss (model.output_router_logits; transformers' load_balancing_loss_func):
// each MoE layer's router statistics [1, 2, E] from its probs (top-k token counts and summed
// probabilities, Builder::moe_router_stats) ...
Node* moe_layer_stats(Builder& b, const ModelConfig& m, Node* probs);
// ... and the loss over the layers' statistics stacked [L, 2, E]: the node "aux_loss" (the loss
// itself, a graph output; graph/passes/autosp/normalize_loss reduces its statistics over the SP
// group and sets its share) times router_aux_loss_coef, the term the model adds to the LM loss.
// The stacked statistics "router_stats" are a graph output too (the expert load in the metrics).
Node* moe_weighted_aux_loss(Builder& b, const ModelConfig& m, const std::vector<Node*>& layer_stats);

// The names of expert e's gate, up and down projection weights, and of the router's, under `layer`.
std::string moe_expert_weight(const ModelConfig& m, const std::string& layer, int64_t e, int which);
std::string moe_router_weight(const ModelConfig& m, const std::string& layer);
// gpt-oss's expert biases: expert e's gate, up [I] and down [C] bias, beside its weights.
std::string moe_expert_bias(const ModelConfig& m, const std::string& layer, int64_t e, int which);

}  // namespace autosp
