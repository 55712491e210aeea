// A mixture-of-experts MLP (Mixtral's MixtralSparseMoeBlock, Qwen2-MoE's and Qwen3-MoE's
// Qwen2MoeSparseMoeBlock) recorded into a Llama-layout graph (models/model.cpp calls it for the
// layers ModelConfig::sparse_layer names). Shapes: B, S, C (hidden), E (experts), I (expert width).
// Knows nothing of kernels or configs beyond ModelConfig.
//
//   probs = softmax(f32(x · routerᵀ))                 [B, S, E]  (the router in f32, as transformers)
//   y     = moe_experts(x, probs, w_gate, w_up, w_down)          (top-k, dropless; graph/ops.h)
//   Qwen2-MoE: y += sigmoid(x · shared_expert_gateᵀ) ∘ shared_expert(x)
//
// The experts' parameters keep Hugging Face's per-expert names and shapes ([I, C] and [C, I]), so
// checkpoints, the loader, ZeRO and the optimizer see ordinary tensors, and moe_experts takes them
// as they are (3E inputs): no stacked copy of the experts is ever made or kept for the backward.
#pragma once

#include <functional>
#include <string>

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

// The names of expert e's gate, up and down projection weights, and of the router's, under `layer`.
std::string moe_expert_weight(const ModelConfig& m, const std::string& layer, int64_t e, int which);
std::string moe_router_weight(const ModelConfig& m, const std::string& layer);

}  // namespace autosp
