// Builder: one method per op, each a thin call to Graph::add with the op's attributes.
#include "graph/builder.h"

#include "tensor/check.h"



namespace autosp {

Node* Builder::op(Op op, std::vector<Node*> inputs, Attrs attrs, const std::string& name) {
  return g_.add(op, std::move(inputs), std::move(attrs), prefix_ + name);
}

Node* Builder::input(const std::string& name, DType dtype, SymShape shape, Role role) {
  return g_.add(Op::input, {}, {}, name, role, TensorType{dtype, std::move(shape)});
}
Node* Builder::parameter(const std::string& name, DType dtype, SymShape shape) {
  return g_.add(Op::parameter, {}, {}, name, Role::parameter, TensorType{dtype, std::move(shape)});
}

Node* Builder::embedding(Node* w, Node* ids, const std::string& name) { return op(Op::embedding, {w, ids}, {}, name); }
Node* Builder::matmul(Node* a, Node* b, bool ta, bool tb, const std::string& name) {
  return op(Op::matmul, {a, b}, {{"trans_a", ta}, {"trans_b", tb}}, name);
}
Node* Builder::linear(Node* x, Node* w, Node* bias, bool w_out_in, const std::string& name) {
  Node* y = matmul(x, w, false, w_out_in, name);
  return bias ? add(y, bias, name + ".b") : y;
}
Node* Builder::add(Node* a, Node* b, const std::string& name) { return op(Op::add, {a, b}, {}, name); }
Node* Builder::sub(Node* a, Node* b, const std::string& name) { return op(Op::sub, {a, b}, {}, name); }
Node* Builder::mul(Node* a, Node* b, const std::string& name) { return op(Op::mul, {a, b}, {}, name); }
Node* Builder::div(Node* a, Node* b, const std::string& name) { return op(Op::div, {a, b}, {}, name); }
Node* Builder::scale(Node* x, double f, const std::string& name) { return op(Op::scale, {x}, {{"factor", f}}, name); }
Node* Builder::dropout(Node* x, Node* token_index, double p, int64_t seed, const std::string& name) {
  return op(Op::dropout, {x, token_index}, {{"p", p}, {"seed", seed}}, name);
}
Node* Builder::neg(Node* x, const std::string& name) { return op(Op::neg, {x}, {}, name); }
Node* Builder::exp(Node* x, const std::string& name) { return op(Op::exp, {x}, {}, name); }
Node* Builder::tanh(Node* x, const std::string& name) { return op(Op::tanh, {x}, {}, name); }
Node* Builder::gelu_tanh(Node* x, const std::string& name) { return op(Op::gelu_tanh, {x}, {}, name); }
Node* Builder::silu(Node* x, const std::string& name) { return op(Op::silu, {x}, {}, name); }
Node* Builder::reshape(Node* x, SymShape shape, const std::string& name) {
  return op(Op::reshape, {x}, {{"shape", std::move(shape)}}, name);
}
Node* Builder::transpose(Node* x, int d0, int d1, const std::string& name) {
  return op(Op::transpose, {x}, {{"dim0", int64_t{d0}}, {"dim1", int64_t{d1}}}, name);
}
Node* Builder::permute(Node* x, std::vector<int64_t> perm, const std::string& name) {
  return op(Op::permute, {x}, {{"perm", std::move(perm)}}, name);
}
Node* Builder::slice(Node* x, int dim, Dim start, Dim end, const std::string& name) {
  return op(Op::slice, {x}, {{"dim", int64_t{dim}}, {"start", std::move(start)}, {"end", std::move(end)}}, name);
}
std::vector<Node*> Builder::split(Node* x, int dim, const std::vector<Dim>& sizes, const std::string& name) {
  std::vector<Node*> out;
  Dim at(0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(slice(x, dim, at, at + sizes[i], name + "." + std::to_string(i)));
    at = at + sizes[i];
  }
  return out;
}
Node* Builder::concat(std::vector<Node*> xs, int dim, const std::string& name) {
  return op(Op::concat, std::move(xs), {{"dim", int64_t{dim}}}, name);
}
Node* Builder::layernorm(Node* x, Node* w, Node* b, double eps, const std::string& name) {
  return op(Op::layernorm, {x, w, b}, {{"eps", eps}}, name);
}
Node* Builder::rmsnorm(Node* x, Node* w, double eps, const std::string& name) {
  return op(Op::rmsnorm, {x, w}, {{"eps", eps}}, name);
}
Node* Builder::softmax(Node* x, const std::string& name) { return op(Op::softmax, {x}, {}, name); }
Node* Builder::add_layernorm(Node* x, Node* r, Node* w, Node* b, double eps, const std::string& name) {
  return op(Op::add_layernorm, {x, r, w, b}, {{"eps", eps}}, name);
}
Node* Builder::add_rmsnorm(Node* x, Node* r, Node* w, double eps, const std::string& name) {
  return op(Op::add_rmsnorm, {x, r, w}, {{"eps", eps}}, name);
}
Node* Builder::bias_gelu_tanh(Node* x, Node* b, const std::string& name) {
  return op(Op::bias_gelu_tanh, {x, b}, {}, name);
}
Node* Builder::swiglu(Node* g, Node* u, const std::string& name) { return op(Op::swiglu, {g, u}, {}, name); }
Node* Builder::swiglu_mlp(Node* x, Node* w_gate, Node* w_up, Node* w_down, const std::string& name) {
  return op(Op::swiglu_mlp, {x, w_gate, w_up, w_down}, {}, name);
}
Node* Builder::linear_cross_entropy_sum(Node* x, Node* w, Node* labels, const std::string& name) {
  return op(Op::linear_cross_entropy_sum, {x, w, labels}, {{"ignore_index", kIgnoreIndex}}, name);
}
Node* Builder::linear_sequence_logps(Node* x, Node* w, Node* labels, Node* slots, int64_t K, const std::string& name) {
  return op(Op::linear_cross_entropy_sum, {x, w, labels, slots}, {{"ignore_index", kIgnoreIndex}, {"slots", K}}, name);
}
Node* Builder::moe_experts(Node* x, Node* probs, const std::vector<Node*>& w_gate, const std::vector<Node*>& w_up,
                           const std::vector<Node*>& w_down, int64_t top_k, bool norm_topk_prob,
                           const std::string& name, const MoeExpertOptions& opt) {
  std::vector<Node*> in{x, probs};
  for (const auto* w : {&w_gate, &w_up, &w_down}) in.insert(in.end(), w->begin(), w->end());
  Attrs a{{"top_k", top_k}, {"norm_topk_prob", norm_topk_prob}};
  const bool biased = !opt.b_gate.empty() || !opt.b_up.empty() || !opt.b_down.empty();
  if (biased) {
    for (const auto* b : {&opt.b_gate, &opt.b_up, &opt.b_down}) {
      if (b->size() != w_gate.size())
        throw UsageError(str("[moe_experts] ", prefix_, name, ": ", w_gate.size(), " experts but ", opt.b_gate.size(),
                             " gate, ", opt.b_up.size(), " up and ", opt.b_down.size(),
                             " down biases (expected all or none)"));
      in.insert(in.end(), b->begin(), b->end());
    }
    a.set("biases", true);
  }
  if (opt.act == MoeActivation::clamped_swiglu) {
    a.set("activation", std::string("clamped_swiglu"));
    a.set("alpha", opt.alpha);
    a.set("limit", opt.limit);
  }
  return op(Op::moe_experts, std::move(in), std::move(a), name);
}
Node* Builder::moe_experts_ep(Node* x, Node* probs, const std::vector<Node*>& weights, int64_t top_k,
                              bool norm_topk_prob, const std::string& group, int64_t group_size,
                              const std::string& name) {
  std::vector<Node*> in{x, probs};
  in.insert(in.end(), weights.begin(), weights.end());
  return op(Op::moe_experts_ep, std::move(in),
            {{"top_k", top_k}, {"norm_topk_prob", norm_topk_prob}, {"group", group}, {"group_size", group_size}},
            name);
}
Node* Builder::rope(Node* x, Node* pos, double theta, const std::string& name) {
  return op(Op::rope, {x, pos}, {{"theta", theta}}, name);
}
namespace {
std::vector<Node*> attention_operands(std::vector<Node*> in, Node* doc_start, Node* sinks) {
  if (doc_start) in.push_back(doc_start);
  if (sinks) in.push_back(sinks);
  return in;
}
}  // namespace

Node* Builder::sdpa(Node* q, Node* k, Node* v, bool causal, double scale, const std::string& name, Node* doc_start,
                    const AttentionAttrs& variant, Node* sinks) {
  std::vector<Node*> in = attention_operands({q, k, v}, doc_start, sinks);
  Attrs attrs{{"causal", causal}, {"scale", scale}};
  if (variant.window > 0) attrs.set("window", variant.window);
  if (variant.softcap != 0) attrs.set("softcap", variant.softcap);
  return op(Op::sdpa, std::move(in), std::move(attrs), name);
}
void set_attention_attrs(Node* n, const AttentionAttrs& a) {
  if (a.window != 0) n->attrs().set("window", a.window);
  if (a.softcap != 0) n->attrs().set("softcap", a.softcap);
}
AttentionAttrs attention_attrs(const Node& n) {
  const Attrs& a = n.attrs();
  return {a.has("window") ? a.i("window") : 0, a.has("softcap") ? a.f("softcap") : 0.0};
}
AttentionInputs attention_inputs(const Node& n) {
  AttentionInputs a;
  a.first = n.op() == Op::sdpa_backward || n.op() == Op::ring_attention_backward ? 6 : 3;
  for (size_t i = a.first; i < n.inputs().size(); ++i)
    (is_floating(n.input(i)->dtype()) ? a.sinks : a.doc_start) = n.input(i);
  return a;
}
Node* Builder::ring_attention(Node* q, Node* k, Node* v, bool causal, double scale, const std::string& group,
                              int64_t group_size, const std::string& name, Node* doc_start, Node* sinks) {
  std::vector<Node*> in = attention_operands({q, k, v}, doc_start, sinks);
  return op(Op::ring_attention, std::move(in),
            {{"causal", causal}, {"scale", scale}, {"group", group}, {"group_size", group_size}}, name);
}
Node* Builder::sequence_logps(Node* logits, Node* labels, Node* pair_slots, int64_t slots, const std::string& name) {
  return op(Op::sequence_logps, {logits, labels, pair_slots}, {{"slots", slots}, {"ignore_index", kIgnoreIndex}}, name);
}

Node* Builder::dpo_loss(Node* policy, Node* reference, Node* tokens, Node* norms, const DpoLoss& spec,
                        const std::string& name) {
  return op(Op::dpo_loss, {policy, reference, tokens, norms},
            {{"beta", spec.beta}, {"loss_type", spec.loss_type}, {"label_smoothing", spec.label_smoothing},
             {"rpo_alpha", spec.rpo_alpha}, {"share", 1.0}},
            name);
}

Node* Builder::moe_router_stats(Node* probs, int64_t top_k, const std::string& name) {
  return op(Op::moe_router_stats, {probs}, {{"top_k", top_k}}, name);
}

Node* Builder::moe_aux_loss(Node* stats, int64_t top_k, const std::string& name) {
  return op(Op::moe_aux_loss, {stats}, {{"top_k", top_k}, {"share", 1.0}}, name);
}

Node* Builder::moe_aux_loss_backward(Node* forward, Node* grad, const std::string& name) {
  AUTOSP_ASSERT(forward->op() == Op::moe_aux_loss, forward->name(), " is no moe_aux_loss");
  return op(Op::moe_aux_loss_backward, {forward->input(0), grad}, forward->attrs(), name);
}

Node* Builder::sequence_logps_backward(Node* forward, Node* grad, const std::string& name) {
  AUTOSP_ASSERT(forward->op() == Op::sequence_logps, forward->name(), " is no sequence_logps");
  return op(Op::sequence_logps_backward, {forward->input(0), forward->input(1), forward->input(2), grad},
            forward->attrs(), name);
}

Node* Builder::dpo_loss_backward(Node* forward, Node* grad, const std::string& name) {
  AUTOSP_ASSERT(forward->op() == Op::dpo_loss, forward->name(), " is no dpo_loss");
  std::vector<Node*> inputs = forward->inputs();
  inputs.push_back(grad);
  return op(Op::dpo_loss_backward, std::move(inputs), forward->attrs(), name);
}

Node* Builder::cross_entropy_sum(Node* logits, Node* labels, const std::string& name) {
  return op(Op::cross_entropy_sum, {logits, labels}, {{"ignore_index", kIgnoreIndex}}, name);
}
Node* Builder::count_valid(Node* labels, DType dtype, const std::string& name) {
  return op(Op::count_valid, {labels},
            {{"ignore_index", kIgnoreIndex}, {"dtype", std::string(dtype_name(dtype))}}, name);
}

Node* Builder::full(SymShape shape, double value, DType dtype, const std::string& name) {
  return op(Op::full, {}, {{"shape", std::move(shape)}, {"value", value}, {"dtype", std::string(dtype_name(dtype))}}, name);
}
Node* Builder::cast(Node* x, DType dtype, const std::string& name) {
  return op(Op::cast, {x}, {{"dtype", std::string(dtype_name(dtype))}}, name);
}
Node* Builder::causal_mask(Node* scores, double value, const std::string& name) {
  return op(Op::causal_mask, {scores}, {{"value", value}}, name);
}
Node* Builder::all_to_all(Node* x, int scatter_dim, int gather_dim, const std::string& group, int64_t group_size,
                          const std::string& name) {
  return op(Op::all_to_all, {x},
            {{"scatter_dim", int64_t{scatter_dim}}, {"gather_dim", int64_t{gather_dim}}, {"group", group},
             {"group_size", group_size}},
            name);
}
Node* Builder::all_gather(Node* x, const std::string& group, int64_t group_size, SymShape shape,
                          const std::string& name) {
  return op(Op::all_gather, {x}, {{"group", group}, {"group_size", group_size}, {"shape", std::move(shape)}}, name);
}

Node* Builder::reduce_scatter(Node* x, const std::string& group, int64_t group_size, const std::string& name) {
  return op(Op::reduce_scatter, {x}, {{"group", group}, {"group_size", group_size}}, name);
}

Node* Builder::all_reduce(Node* x, const std::string& group, const std::string& name) {
  return op(Op::all_reduce, {x}, {{"group", group}}, name);
}
Node* Builder::output(Node* x, int64_t index, const std::string& name) {
  return op(Op::output, {x}, {{"index", index}}, name);
}
Node* Builder::sum_to(Node* x, SymShape shape, const std::string& name) {
  return op(Op::sum_to, {x}, {{"shape", std::move(shape)}}, name);
}
Node* Builder::embedding_backward(Node* dy, Node* ids, Dim v, const std::string& name) {
  return op(Op::embedding_backward, {dy, ids}, {{"num_embeddings", std::move(v)}}, name);
}
Node* Builder::gelu_tanh_backward(Node* dy, Node* x, const std::string& name) {
  return op(Op::gelu_tanh_backward, {dy, x}, {}, name);
}
Node* Builder::silu_backward(Node* dy, Node* x, const std::string& name) { return op(Op::silu_backward, {dy, x}, {}, name); }
Node* Builder::bias_gelu_tanh_backward(Node* dy, Node* x, Node* b, const std::string& name) {
  return op(Op::bias_gelu_tanh_backward, {dy, x, b}, {}, name);
}
Node* Builder::qkv_heads(Node* x, Node* b, int64_t heads, const std::string& name) {
  return op(Op::qkv_heads, {x, b}, {{"heads", heads}}, name);
}
Node* Builder::qkv_heads_backward(Node* dq, Node* dk, Node* dv, const std::string& name) {
  return op(Op::qkv_heads_backward, {dq, dk, dv}, {}, name);
}
Node* Builder::swiglu_backward(Node* dy, Node* g, Node* u, const std::string& name) {
  return op(Op::swiglu_backward, {dy, g, u}, {}, name);
}
Node* Builder::slice_backward(Node* dy, int64_t dim, Dim start, Dim end, Dim size, const std::string& name) {
  return op(Op::slice_backward, {dy},
            {{"dim", dim}, {"start", std::move(start)}, {"end", std::move(end)}, {"size", std::move(size)}}, name);
}
Node* Builder::layernorm_backward(Node* dy, Node* x, Node* w, double eps, const std::string& name) {
  return op(Op::layernorm_backward, {dy, x, w}, {{"eps", eps}}, name);
}
Node* Builder::rmsnorm_backward(Node* dy, Node* x, Node* w, double eps, const std::string& name) {
  return op(Op::rmsnorm_backward, {dy, x, w}, {{"eps", eps}}, name);
}
Node* Builder::softmax_backward(Node* dy, Node* y, const std::string& name) {
  return op(Op::softmax_backward, {dy, y}, {}, name);
}
Node* Builder::rope_backward(Node* dy, Node* pos, double theta, const std::string& name) {
  return op(Op::rope_backward, {dy, pos}, {{"theta", theta}}, name);
}
Node* Builder::sdpa_backward(Node* q, Node* k, Node* v, Node* o, Node* lse, Node* dout, bool causal, double scale,
                             const std::string& name, Node* doc_start, Node* sinks) {
  std::vector<Node*> in = attention_operands({q, k, v, o, lse, dout}, doc_start, sinks);
  return op(Op::sdpa_backward, std::move(in), {{"causal", causal}, {"scale", scale}}, name);
}
Node* Builder::ring_attention_backward(Node* q, Node* k, Node* v, Node* o, Node* lse, Node* dout, bool causal,
                                       double scale, const std::string& group, int64_t group_size,
                                       const std::string& name, Node* doc_start, Node* sinks) {
  std::vector<Node*> in = attention_operands({q, k, v, o, lse, dout}, doc_start, sinks);
  return op(Op::ring_attention_backward, std::move(in),
            {{"causal", causal}, {"scale", scale}, {"group", group}, {"group_size", group_size}}, name);
}
Node* Builder::cross_entropy_backward(Node* logits, Node* labels, Node* grad, int64_t ignore_index,
                                      const std::string& name) {
  return op(Op::cross_entropy_backward, {logits, labels, grad}, {{"ignore_index", ignore_index}}, name);
}

Node* Builder::swiglu_mlp_backward(Node* dy, Node* x, Node* w_gate, Node* w_up, Node* w_down,
                                  const std::string& name) {
  return op(Op::swiglu_mlp_backward, {dy, x, w_gate, w_up, w_down}, {}, name);
}
Node* Builder::moe_experts_backward(Node* dy, const std::vector<Node*>& inputs, int64_t top_k, bool norm_topk_prob,
                                    const std::string& name) {
  return moe_experts_backward(dy, inputs, {{"top_k", top_k}, {"norm_topk_prob", norm_topk_prob}}, name);
}
Node* Builder::moe_experts_backward(Node* dy, const std::vector<Node*>& inputs, const Attrs& forward,
                                    const std::string& name) {
  std::vector<Node*> in{dy};
  in.insert(in.end(), inputs.begin(), inputs.end());
  return op(Op::moe_experts_backward, std::move(in), forward, name);
}
Node* Builder::moe_experts_ep_backward(Node* dy, const std::vector<Node*>& inputs, const Attrs& forward,
                                       const std::string& name) {
  std::vector<Node*> in{dy};
  in.insert(in.end(), inputs.begin(), inputs.end());
  return op(Op::moe_experts_ep_backward, std::move(in), forward, name);
}
Node* Builder::linear_cross_entropy_backward(Node* x, Node* w, Node* labels, Node* grad, int64_t ignore_index,
                                             const std::string& name, Node* slots, int64_t K) {
  if (!slots) return op(Op::linear_cross_entropy_backward, {x, w, labels, grad}, {{"ignore_index", ignore_index}}, name);
  return op(Op::linear_cross_entropy_backward, {x, w, labels, grad, slots},
            {{"ignore_index", ignore_index}, {"slots", K}}, name);
}

}  // namespace autosp
