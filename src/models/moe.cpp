// The mixture-of-experts MLP (models/moe.h), by the family row's Moe column: Mixtral's names under
// block_sparse_moe (experts w1 = gate, w3 = up, w2 = down; weights always renormalised), Qwen's
// under mlp (gate_proj, up_proj, down_proj; norm_topk_prob), Qwen2-MoE's shared expert, gpt-oss's
// (Qwen's names, the router mlp.router with a bias, experts with biases, the clamped SwiGLU).
#include "models/moe.h"

#include "tensor/check.h"

namespace autosp {
namespace {

// sigmoid(z) = 1 / (1 + exp(-z))
Node* sigmoid(Builder& b, Node* z, const std::string& name) {
  Node* one = b.full({1}, 1.0, z->dtype(), name + ".one");
  return b.div(one, b.add(one, b.exp(b.neg(z, name + ".neg"), name + ".exp"), name + ".den"), name);
}

}  // namespace

std::string moe_expert_weight(const ModelConfig& m, const std::string& layer, int64_t e, int which) {
  static const char* const mixtral[] = {"w1", "w3", "w2"};
  static const char* const qwen[] = {"gate_proj", "up_proj", "down_proj"};
  AUTOSP_ASSERT(which >= 0 && which < 3, "moe_expert_weight ", which);
  if (family(m.arch).moe == Moe::mixtral) return str(layer, "block_sparse_moe.experts.", e, ".", mixtral[which], ".weight");
  return str(layer, "mlp.experts.", e, ".", qwen[which], ".weight");
}

std::string moe_expert_bias(const ModelConfig& m, const std::string& layer, int64_t e, int which) {
  const std::string w = moe_expert_weight(m, layer, e, which);
  return w.substr(0, w.size() - std::string("weight").size()) + "bias";
}

std::string moe_router_weight(const ModelConfig& m, const std::string& layer) {
  switch (family(m.arch).moe) {
    case Moe::mixtral: return layer + "block_sparse_moe.gate.weight";
    case Moe::gpt_oss: return layer + "mlp.router.weight";
    default: return layer + "mlp.gate.weight";
  }
}

MoeBlock moe_block(Builder& b, const ModelConfig& m, const std::string& layer, Node* x, const MakeParam& p) {
  const Family& f = family(m.arch);
  const int64_t C = m.hidden_size, E = m.num_experts, I = m.expert_width();
  const DType dt = x->dtype();
  const bool gpt_oss = f.moe == Moe::gpt_oss;  // the router's and the experts' biases, the clamped SwiGLU
  // router: x [B, S, C] · routerᵀ [C, E] (+ bias [E]) → probs [B, S, E], softmax in f32
  Node* router_w = p(moe_router_weight(m, layer), {E, C});
  Node* router_b = gpt_oss ? p(layer + "mlp.router.bias", {E}) : nullptr;
  Node* logits = b.linear(x, router_w, router_b, true, "router");
  const bool narrow = dt != DType::f32 && dt != DType::f64;
  Node* probs = b.softmax(narrow ? b.cast(logits, DType::f32, "router_f32") : logits, "router_probs");
  std::vector<Node*> w[3];
  MoeExpertOptions opt;
  for (int64_t e = 0; e < E; ++e) {
    for (int which = 0; which < 3; ++which) {
      const bool down = which == 2;
      w[which].push_back(p(moe_expert_weight(m, layer, e, which), down ? SymShape{C, I} : SymShape{I, C}));
    }
    if (!gpt_oss) continue;
    opt.b_gate.push_back(p(moe_expert_bias(m, layer, e, 0), {I}));
    opt.b_up.push_back(p(moe_expert_bias(m, layer, e, 1), {I}));
    opt.b_down.push_back(p(moe_expert_bias(m, layer, e, 2), {C}));
  }
  if (gpt_oss) {
    opt.act = MoeActivation::clamped_swiglu;
    opt.alpha = m.swiglu_alpha;
    opt.limit = m.swiglu_limit;
  }
  // gpt-oss's softmax over the top-k logits is the top-k probabilities renormalised (decision 201).
  const bool norm = f.moe == Moe::mixtral || gpt_oss || m.norm_topk_prob;
  Node* routed = narrow ? b.cast(probs, dt, "router_weights") : probs;  // transformers: .to(hidden dtype)
  Node* y = b.moe_experts(x, routed, w[0], w[1], w[2], m.num_experts_per_tok, norm, "experts", opt);
  if (f.shared_expert) {  // Qwen2-MoE: every token also takes the shared expert, gated
    const int64_t Is = m.shared_expert_intermediate_size;
    const std::string se = layer + "mlp.shared_expert.";
    Node* gate = b.linear(x, p(se + "gate_proj.weight", {Is, C}), nullptr, true, "shared_gate");
    Node* up = b.linear(x, p(se + "up_proj.weight", {Is, C}), nullptr, true, "shared_up");
    Node* act = b.mul(b.silu(gate, "shared_silu"), up, "shared_swiglu");
    Node* out = b.linear(act, p(se + "down_proj.weight", {C, Is}), nullptr, true, "shared_down");
    Node* z = b.linear(x, p(layer + "mlp.shared_expert_gate.weight", {1, C}), nullptr, true, "shared_expert_gate");
    y = b.add(y, b.mul(sigmoid(b, z, "shared_sigmoid"), out, "shared_out"), "moe_out");
  }
  return {y, probs};
}

// ---- the load-balancing loss (models/moe.h; kernels/moe_aux.h) ----

Node* moe_layer_stats(Builder& b, const ModelConfig& m, Node* probs) {
  Node* stats = b.moe_router_stats(probs, m.num_experts_per_tok, "router_stats");  // [2, E]
  return b.reshape(stats, {Dim(1), Dim(2), Dim(m.num_experts)}, "router_stats.row");
}

Node* moe_weighted_aux_loss(Builder& b, const ModelConfig& m, const std::vector<Node*>& layer_stats) {
  AUTOSP_ASSERT(!layer_stats.empty(), "the load-balancing loss needs a mixture-of-experts layer");
  Node* stats = b.concat(layer_stats, 0, "router_stats");  // [L, 2, E]
  b.graph().add_output(stats);
  Node* aux = b.moe_aux_loss(stats, m.num_experts_per_tok, "aux_loss");
  b.graph().add_output(aux);
  return b.scale(aux, m.router_aux_loss_coef, "aux_loss.weighted");
}

}  // namespace autosp
