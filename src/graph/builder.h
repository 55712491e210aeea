// Builder: the API model code uses to record a forward graph. Each call appends one node whose
// type comes from the op's shape rule, so a mistake throws at the line that made it, naming the op
// and the shapes. Shapes are spelled with symbols (B, S), never -1.
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"

namespace autosp {

// The attention variants beyond causal softmax attention, as optional attributes of sdpa,
// ring_attention and their backwards (the kernels' meaning: kernels/attention_variant.h): "window"
// (int > 0: a query sees itself and the window - 1 keys before it, Hugging Face's sliding_window)
// and "softcap" (float > 0: logits become softcap · tanh(logit / softcap)). Absent: none, so
// plain attention's IR is unchanged. The verifier rejects other values (graph/ops.cpp).
struct AttentionAttrs {
  int64_t window = 0;
  double softcap = 0;
  bool operator==(const AttentionAttrs&) const = default;
};
void set_attention_attrs(Node* n, const AttentionAttrs& a);
AttentionAttrs attention_attrs(const Node& n);
// The optional trailing inputs of an attention node (sdpa, ring_attention: after q, k, v; their
// backwards: after q, k, v, o, lse, dout): the document starts (integer) and the sinks (float),
// each absent or present, in that order; told apart by dtype.
struct AttentionInputs {
  Node* doc_start = nullptr;
  Node* sinks = nullptr;
  size_t first = 3;  // the index of the first optional input
};
AttentionInputs attention_inputs(const Node& n);
// dpo_loss's attributes: TRL's DPOConfig beta, loss_type ("sigmoid" or "ipo"), label_smoothing and
// rpo_alpha (0: none).
struct DpoLoss {
  double beta = 0.1;
  std::string loss_type = "sigmoid";
  double label_smoothing = 0, rpo_alpha = 0;
};
// gpt-oss's expert options for moe_experts (models/moe.cpp sets them from the family row).
enum class MoeActivation { swiglu, clamped_swiglu };
struct MoeExpertOptions {
  std::vector<Node*> b_gate, b_up, b_down;  // empty (no biases), or one per expert: [I], [I], [C]
  MoeActivation act = MoeActivation::swiglu;
  double alpha = 1.702, limit = 7.0;        // clamped_swiglu's (gpt-oss: alpha 1.702, swiglu_limit)
};

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }

  // Name prefix for the nodes that follow ("l0."), so printed graphs read by layer.
  void set_prefix(std::string p) { prefix_ = std::move(p); }

  Node* input(const std::string& name, DType dtype, SymShape shape, Role role);
  Node* parameter(const std::string& name, DType dtype, SymShape shape);

  Node* embedding(Node* weight, Node* ids, const std::string& name = "emb");
  Node* matmul(Node* a, Node* b, bool trans_a, bool trans_b, const std::string& name = "mm");
  // x [..., in] · W: W [out, in] when w_out_in (nn.Linear), else W [in, out] (GPT-2 Conv1D); + bias.
  Node* linear(Node* x, Node* w, Node* bias, bool w_out_in, const std::string& name);
  Node* add(Node* a, Node* b, const std::string& name = "add");
  Node* sub(Node* a, Node* b, const std::string& name = "sub");
  Node* mul(Node* a, Node* b, const std::string& name = "mul");
  Node* div(Node* a, Node* b, const std::string& name = "div");
  Node* scale(Node* x, double factor, const std::string& name = "scale");
  // Inverted dropout of x [..., C] with the mask of (seed, token_index [...], feature): graph/ops.h.
  Node* dropout(Node* x, Node* token_index, double p, int64_t seed, const std::string& name = "dropout");
  Node* neg(Node* x, const std::string& name = "neg");
  Node* exp(Node* x, const std::string& name = "exp");
  Node* tanh(Node* x, const std::string& name = "tanh");
  Node* gelu_tanh(Node* x, const std::string& name = "gelu");
  Node* silu(Node* x, const std::string& name = "silu");
  Node* reshape(Node* x, SymShape shape, const std::string& name = "reshape");
  Node* transpose(Node* x, int dim0, int dim1, const std::string& name = "transpose");
  Node* permute(Node* x, std::vector<int64_t> perm, const std::string& name = "permute");
  Node* slice(Node* x, int dim, Dim start, Dim end, const std::string& name = "slice");
  // Split along `dim` into pieces of the given sizes (one slice node each).
  std::vector<Node*> split(Node* x, int dim, const std::vector<Dim>& sizes, const std::string& name = "split");
  Node* concat(std::vector<Node*> xs, int dim, const std::string& name = "concat");
  Node* layernorm(Node* x, Node* w, Node* b, double eps, const std::string& name = "ln");
  Node* rmsnorm(Node* x, Node* w, double eps, const std::string& name = "rms");
  Node* softmax(Node* x, const std::string& name = "softmax");
  Node* rope(Node* x, Node* position_ids, double theta, const std::string& name = "rope");
  // doc_start (optional, i64 [B, S]): query i sees only keys j ≥ doc_start[i] (packed documents).
  // variant: a sliding window and a logit softcap, as the node's optional attributes
  // (AttentionAttrs below). sinks (optional, [N] of q's dtype): gpt-oss's learned logit per query
  // head, in every softmax denominator (kernels/attention_variant.h), the last input.
  Node* sdpa(Node* q, Node* k, Node* v, bool causal, double scale, const std::string& name = "attn",
             Node* doc_start = nullptr, const AttentionAttrs& variant = {}, Node* sinks = nullptr);
  // sdpa over the `group_size` ranks of a ring group, each holding its zigzag chunks of the
  // sequence (graph/passes/autosp/insert_ring_attention).
  Node* ring_attention(Node* q, Node* k, Node* v, bool causal, double scale, const std::string& group,
                       int64_t group_size, const std::string& name = "ring_attn", Node* doc_start = nullptr,
                       Node* sinks = nullptr);
  Node* cross_entropy_sum(Node* logits, Node* labels, const std::string& name = "ce_sum");
  Node* count_valid(Node* labels, DType dtype, const std::string& name = "valid");
  Node* full(SymShape shape, double value, DType dtype, const std::string& name = "full");
  // scores [..., Sq, Skv] with entries j > i + (Skv - Sq) replaced by `value` (-inf for attention).
  Node* causal_mask(Node* scores, double value, const std::string& name = "mask");
  // Collectives over a named process group ("sp", "world") of `group_size` ranks.
  Node* all_to_all(Node* x, int scatter_dim, int gather_dim, const std::string& group, int64_t group_size,
                   const std::string& name = "a2a");
  Node* all_reduce(Node* x, const std::string& group, const std::string& name = "all_reduce");
  // ZeRO-3: the whole tensor `shape` from every rank's shard x [ceil(numel / group_size)], and back.
  Node* all_gather(Node* x, const std::string& group, int64_t group_size, SymShape shape,
                   const std::string& name = "all_gather");
  Node* reduce_scatter(Node* x, const std::string& group, int64_t group_size, const std::string& name = "reduce_scatter");
  // x converted to `dtype` (f32, f64, bf16; to bf16 rounds to nearest even).
  Node* cast(Node* x, DType dtype, const std::string& name = "cast");
  // Extra output `index` (1, 2, ...) of a multi-output node.
  Node* output(Node* x, int64_t index, const std::string& name = "out");
  // Fused ops (passes/fuse_elementwise): y = norm(x + r), extra output 1 = x + r (read it with
  // output(node, 1)); y = gelu_tanh(x + b), b [C] broadcast over x [..., C].
  Node* add_layernorm(Node* x, Node* r, Node* w, Node* b, double eps, const std::string& name = "add_ln");
  Node* add_rmsnorm(Node* x, Node* r, Node* w, double eps, const std::string& name = "add_rms");
  Node* bias_gelu_tanh(Node* x, Node* b, const std::string& name = "bias_gelu");
  // GPT-2's qkv into heads (made by fuse_elementwise): x [B, S, 3·N·D] + b → q [B, N, S, D], extra
  // outputs 1, 2: k, v (read them with output(node, i)).
  Node* qkv_heads(Node* x, Node* b, int64_t heads, const std::string& name = "qkv_heads");
  // silu(g) · u, g and u of one shape (Llama's SwiGLU activation, made by fuse_elementwise).
  Node* swiglu(Node* g, Node* u, const std::string& name = "swiglu");
  // Llama's MLP as one tiled op: (silu(x·w_gateᵀ) ∘ (x·w_upᵀ))·w_downᵀ, x [..., C], w_gate and
  // w_up [I, C], w_down [C, I] (nn.Linear layout); computed over chunks of rows (kernels/cpu/mlp.h).
  Node* swiglu_mlp(Node* x, Node* w_gate, Node* w_up, Node* w_down, const std::string& name = "mlp");
  // cross_entropy_sum(x · wᵀ, labels) with no [..., V] logits: x [..., C], w [V, C]; extra output 1
  // is each row's argmax over V (i64 [...], read with output(node, 1)).
  Node* linear_cross_entropy_sum(Node* x, Node* w, Node* labels, const std::string& name = "loss_sum");
  // Its DPO form: sequence_logps(x · wᵀ, labels, slots) [B, 2, K] with no [B, S, V] logits (the same
  // op with the pair slots fourth; its extra output is still the argmax).
  Node* linear_sequence_logps(Node* x, Node* w, Node* labels, Node* slots, int64_t K,
                              const std::string& name = "sequence_logps");
  // A mixture-of-experts layer's experts: each token of x [..., C] goes to the top_k experts of
  // its router probabilities probs [..., E] (weights renormalised over the k when norm_topk_prob),
  // y = Σ weight · (silu(x·w_gate[e]ᵀ) ∘ (x·w_up[e]ᵀ))·w_down[e]ᵀ; E weights each, w_gate[e] and
  // w_up[e] [I, C], w_down[e] [C, I] (kernels/cpu/moe.h). Inputs: x, probs, the gates, ups, downs,
  // then with opt's biases the gate, up and down biases; the options' attributes: "biases" (set
  // when there are biases), "activation", "alpha", "limit" (set for clamped_swiglu; ops.h moe_biased).
  // With opt (gpt-oss), per expert g = x·w_gateᵀ + b_gate, u = x·w_upᵀ + b_up, and
  //   swiglu:         h = silu(g) ∘ u
  //   clamped_swiglu: h = (clamp(u, −limit, limit) + 1) ∘ gc ∘ σ(alpha·gc), gc = min(g, limit)
  // out = h·w_downᵀ + b_down (a clamp's gradient as torch.clamp's: 1 inside, bounds included).
  Node* moe_experts(Node* x, Node* probs, const std::vector<Node*>& w_gate, const std::vector<Node*>& w_up,
                    const std::vector<Node*>& w_down, int64_t top_k, bool norm_topk_prob,
                    const std::string& name = "moe", const MoeExpertOptions& opt = {});
  // The same over an expert group (graph/passes/expert_parallel.h): `weights` are this rank's
  // E / group_size local experts' (gates, ups, downs), the group named `group`.
  Node* moe_experts_ep(Node* x, Node* probs, const std::vector<Node*>& weights, int64_t top_k, bool norm_topk_prob,
                       const std::string& group, int64_t group_size, const std::string& name = "moe");
  // Preference training (train.objective "dpo"): each sequence's summed completion log-probability,
  // [B, 2, slots] (chosen, rejected of pair slot k), from logits [B, S, V], labels [B, S] and the
  // targets' slots [B, S] (+(k + 1) chosen, -(k + 1) rejected, 0 none) ...
  Node* sequence_logps(Node* logits, Node* labels, Node* pair_slots, int64_t slots,
                       const std::string& name = "sequence_logps");
  // ... and TRL's DPO loss on them: policy, reference and completion tokens [B, 2, K], norms [2] =
  // (the step's pairs, its chosen completion tokens); the loss is Σ over present pairs of the
  // pair's loss / norms[0], plus rpo_alpha · (−Σ chosen log-probabilities) / norms[1], times
  // `share` (normalize_loss sets 1/P for a sequence-parallel group of P ranks).
  Node* dpo_loss(Node* policy, Node* reference, Node* tokens, Node* norms, const DpoLoss& spec,
                 const std::string& name = "loss");
  // A mixture-of-experts layer's router statistics [2, E] from its probs [..., E]: row 0 counts the
  // tokens whose top-k chose each expert (piecewise constant: no gradient), row 1 sums each
  // expert's probability over the tokens ...
  Node* moe_router_stats(Node* probs, int64_t top_k, const std::string& name = "router_stats");
  // ... and transformers' load-balancing loss over the layers' stats [L, 2, E], times `share`:
  //   E · Σ_e (c_e / N) · (p_e / N),  c, p summed over the layers, N = Σ_e c_e / k  (tokens × layers)
  Node* moe_aux_loss(Node* stats, int64_t top_k, const std::string& name = "aux_loss");

  // Backward-only ops, used by vjp rules.
  Node* sum_to(Node* x, SymShape shape, const std::string& name = "sum_to");
  Node* embedding_backward(Node* dy, Node* ids, Dim num_embeddings, const std::string& name = "embedding_bwd");
  Node* gelu_tanh_backward(Node* dy, Node* x, const std::string& name = "gelu_bwd");
  Node* silu_backward(Node* dy, Node* x, const std::string& name = "silu_bwd");
  // dx = dy · gelu_tanh'(x + b); b's gradient is dx summed to [C] (by autograd).
  Node* bias_gelu_tanh_backward(Node* dy, Node* x, Node* b, const std::string& name = "bias_gelu_bwd");
  // dq, dk, dv [B, N, S, D] side by side as dx [B, S, 3·N·D]; extra output 1: db, dx summed to [3·N·D].
  Node* qkv_heads_backward(Node* dq, Node* dk, Node* dv, const std::string& name = "qkv_heads_bwd");
  // dg; extra output 1: du.
  Node* swiglu_backward(Node* dy, Node* g, Node* u, const std::string& name = "swiglu_bwd");
  Node* slice_backward(Node* dy, int64_t dim, Dim start, Dim end, Dim size, const std::string& name = "slice_bwd");
  Node* layernorm_backward(Node* dy, Node* x, Node* w, double eps, const std::string& name = "ln_bwd");
  Node* rmsnorm_backward(Node* dy, Node* x, Node* w, double eps, const std::string& name = "rms_bwd");
  Node* softmax_backward(Node* dy, Node* y, const std::string& name = "softmax_bwd");
  Node* rope_backward(Node* dy, Node* position_ids, double theta, const std::string& name = "rope_bwd");
  Node* sdpa_backward(Node* q, Node* k, Node* v, Node* o, Node* lse, Node* dout, bool causal, double scale,
                      const std::string& name = "attn_bwd", Node* doc_start = nullptr, Node* sinks = nullptr);
  Node* ring_attention_backward(Node* q, Node* k, Node* v, Node* o, Node* lse, Node* dout, bool causal, double scale,
                                const std::string& group, int64_t group_size, const std::string& name = "ring_attn_bwd",
                                Node* doc_start = nullptr, Node* sinks = nullptr);
  Node* cross_entropy_backward(Node* logits, Node* labels, Node* grad, int64_t ignore_index,
                               const std::string& name = "ce_bwd");
  // dx; extra outputs dw_gate, dw_up, dw_down (read with output(node, 1..3)).
  Node* swiglu_mlp_backward(Node* dy, Node* x, Node* w_gate, Node* w_up, Node* w_down,
                            const std::string& name = "mlp_bwd");
  // dx; extra outputs dprobs, then each expert weight's gradient in the input order (1 + 3E).
  // Inputs: dy, then moe_experts' inputs.
  Node* moe_experts_backward(Node* dy, const std::vector<Node*>& inputs, int64_t top_k, bool norm_topk_prob,
                             const std::string& name = "moe_bwd");
  // The same with the forward's attributes (gpt-oss's options among them).
  Node* moe_experts_backward(Node* dy, const std::vector<Node*>& inputs, const Attrs& forward,
                             const std::string& name = "moe_bwd");
  // moe_experts_ep's backward (its outputs as moe_experts_backward's), with the forward's attributes.
  Node* moe_experts_ep_backward(Node* dy, const std::vector<Node*>& inputs, const Attrs& forward,
                                const std::string& name = "moe_bwd");
  // dx; extra output dw (read with output(node, 1)).
  // With `slots` (the DPO form), grad is [B, 2, K].
  Node* linear_cross_entropy_backward(Node* x, Node* w, Node* labels, Node* grad, int64_t ignore_index,
                                      const std::string& name = "loss_bwd", Node* slots = nullptr, int64_t K = 0);
  // The gradients of sequence_logps and dpo_loss node `forward`'s first input (its other inputs and
  // attributes as the forward's) from `grad`, the gradient of its output.
  Node* sequence_logps_backward(Node* forward, Node* grad, const std::string& name = "dlogits");
  Node* dpo_loss_backward(Node* forward, Node* grad, const std::string& name = "dlogps");
  // The gradient of moe_aux_loss node `forward`'s stats (its row 0, the counts, gets 0) from `grad`.
  Node* moe_aux_loss_backward(Node* forward, Node* grad, const std::string& name = "dstats");

 private:
  Node* op(Op op, std::vector<Node*> inputs, Attrs attrs, const std::string& name);
  Graph& g_;
  std::string prefix_;
};

}  // namespace autosp
