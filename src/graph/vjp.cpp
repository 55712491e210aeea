// vjp rules: gradients of each op's inputs as IR. Shapes: G is the output gradient, with the
// output's shape; a rule may return a gradient in the broadcast shape, autograd sums it back.
#include "graph/vjp.h"

#include "graph/autograd.h"

namespace autosp::vjp {
namespace {
Dim product(const SymShape& s, size_t from, size_t to) {
  Dim p(1);
  for (size_t i = from; i < to; ++i) p = p * s[i];
  return p;
}
}  // namespace

void no_gradient(VjpContext&) {}

// out [..., C] = weight [V, C] gathered by ids [...]. A padding_idx attribute (HF's nn.Embedding
// padding_idx) goes to the backward, which leaves that row's gradient 0.
void embedding(VjpContext& c) {
  Node* dw = c.b.embedding_backward(c.grad, c.in(1), c.in_shape(0)[0]);
  if (c.node->attrs().has("padding_idx")) dw->attrs().set("padding_idx", c.node->attrs().i("padding_idx"));
  c.input_grads[0] = dw;
}

// C = op(A) · op(B). dop(A) = G · op(B)ᵀ, dop(B) = op(A)ᵀ · G; a transposed operand's gradient is
// the transpose of that. A 2-D B shared over A's batch gets its gradient from the flattened batch.
void matmul(VjpContext& c) {
  Builder& b = c.b;
  Node *A = c.in(0), *B = c.in(1), *G = c.grad;
  const bool ta = c.node->attrs().b("trans_a"), tb = c.node->attrs().b("trans_b");
  const size_t ra = A->shape().size();
  const bool shared_b = B->shape().size() == 2 && ra > 2;
  if (!ta)
    c.input_grads[0] = b.matmul(G, B, false, !tb, "dA");
  else if (!shared_b)
    c.input_grads[0] = b.matmul(B, G, tb, true, "dA");
  else  // dA = (G · op(B)ᵀ)ᵀ over the last two dims
    c.input_grads[0] = b.transpose(b.matmul(G, B, false, !tb, "dAt"), static_cast<int>(ra) - 2,
                                   static_cast<int>(ra) - 1, "dA");
  if (shared_b && !ta) {
    // A [..., M, K] → [R, K] and G [..., M, N] → [R, N], R = product of A's leading dims and M: one GEMM.
    const Dim R = product(A->shape(), 0, ra - 1);
    Node* A2 = b.reshape(A, {R, A->shape()[ra - 1]}, "A2");
    Node* G2 = b.reshape(G, {R, G->shape()[ra - 1]}, "G2");
    c.input_grads[1] = tb ? b.matmul(G2, A2, true, false, "dB") : b.matmul(A2, G2, true, false, "dB");
  } else {
    // Batched; for a shared B the per-batch products are summed back to [K, N] by autograd.
    c.input_grads[1] = tb ? b.matmul(G, A, true, ta, "dB") : b.matmul(A, G, !ta, false, "dB");
  }
}

void add(VjpContext& c) { c.input_grads = {c.grad, c.grad}; }
void sub(VjpContext& c) { c.input_grads = {c.grad, c.b.neg(c.grad, "dB")}; }
void mul(VjpContext& c) {
  c.input_grads = {c.b.mul(c.grad, c.in(1), "dA"), c.b.mul(c.grad, c.in(0), "dB")};
}
// y = a / b: da = G / b, db = -G · y / b
void div(VjpContext& c) {
  c.input_grads[0] = c.b.div(c.grad, c.in(1), "dA");
  c.input_grads[1] = c.b.neg(c.b.div(c.b.mul(c.grad, c.node, "Gy"), c.in(1), "Gy_b"), "dB");
}
void scale(VjpContext& c) { c.input_grads[0] = c.b.scale(c.grad, c.node->attrs().f("factor"), "dx"); }
// y = x · mask / (1 - p) is linear in x with the same mask: dx = dropout(G) by the same token
// indices and attributes (the token indices get no gradient).
void dropout(VjpContext& c) {
  c.input_grads[0] = c.b.dropout(c.grad, c.in(1), c.node->attrs().f("p"), c.node->attrs().i("seed"), "dx");
}
void neg(VjpContext& c) { c.input_grads[0] = c.b.neg(c.grad, "dx"); }
void exp(VjpContext& c) { c.input_grads[0] = c.b.mul(c.grad, c.node, "dx"); }
// y = tanh(x): dx = dy · (1 − y²) = dy − (dy · y) · y
void tanh(VjpContext& c) {
  c.input_grads[0] = c.b.sub(c.grad, c.b.mul(c.b.mul(c.grad, c.node, "dy_y"), c.node, "dy_yy"), "dx");
}
void gelu_tanh(VjpContext& c) { c.input_grads[0] = c.b.gelu_tanh_backward(c.grad, c.in(0), "dx"); }
void silu(VjpContext& c) { c.input_grads[0] = c.b.silu_backward(c.grad, c.in(0), "dx"); }

void reshape(VjpContext& c) { c.input_grads[0] = c.b.reshape(c.grad, c.in_shape(0), "dx"); }
void transpose(VjpContext& c) {
  const auto& a = c.node->attrs();
  c.input_grads[0] = c.b.transpose(c.grad, static_cast<int>(a.i("dim0")), static_cast<int>(a.i("dim1")), "dx");
}
void permute(VjpContext& c) {
  const auto& perm = c.node->attrs().ints("perm");
  const int64_t r = static_cast<int64_t>(perm.size());
  std::vector<int64_t> inverse(perm.size());
  for (int64_t i = 0; i < r; ++i) inverse[(perm[i] + r) % r] = i;
  c.input_grads[0] = c.b.permute(c.grad, inverse, "dx");
}
void slice(VjpContext& c) {
  const auto& a = c.node->attrs();
  const int64_t r = static_cast<int64_t>(c.in_shape(0).size());
  const int64_t d = (a.i("dim") + r) % r;
  c.input_grads[0] = c.b.slice_backward(c.grad, d, a.dim("start"), a.dim("end"), c.in_shape(0)[d], "dx");
}
void concat(VjpContext& c) {
  const int64_t r = static_cast<int64_t>(c.in_shape(0).size());
  const int d = static_cast<int>((c.node->attrs().i("dim") + r) % r);
  Dim at(0);
  for (size_t i = 0; i < c.node->inputs().size(); ++i) {
    const Dim len = c.in_shape(i)[d];
    c.input_grads[i] = c.b.slice(c.grad, d, at, at + len, "dx" + std::to_string(i));
    at = at + len;
  }
}

// y = layernorm(x, w, b): one backward node gives dx, with dw and db as its extra outputs.
void layernorm(VjpContext& c) {
  Node* bwd = c.b.layernorm_backward(c.grad, c.in(0), c.in(1), c.node->attrs().f("eps"), "dx");
  c.input_grads = {bwd, c.b.output(bwd, 1, "dw"), c.b.output(bwd, 2, "db")};
}
void rmsnorm(VjpContext& c) {
  Node* bwd = c.b.rmsnorm_backward(c.grad, c.in(0), c.in(1), c.node->attrs().f("eps"), "dx");
  c.input_grads = {bwd, c.b.output(bwd, 1, "dw")};
}
void softmax(VjpContext& c) { c.input_grads[0] = c.b.softmax_backward(c.grad, c.node, "dx"); }
void rope(VjpContext& c) {
  Node* dx = c.b.rope_backward(c.grad, c.in(1), c.node->attrs().f("theta"), "dx");
  for (const auto& [k, v] : c.node->attrs().map()) dx->attrs().set(k, v);  // rope_scaling, when present
  c.input_grads[0] = dx;
}

// o = sdpa(q, k, v [, doc_start] [, sinks]): the backward recomputes probabilities from the
// forward's saved log-sum-exp (extra output 1 of the sdpa node) and yields dq, with dk, dv (and
// dsinks) as extra outputs. The document starts are integers: no gradient.
namespace {
void attention_grads(VjpContext& c, Node* bwd, const AttentionInputs& in) {
  set_attention_attrs(bwd, attention_attrs(*c.node));
  c.input_grads = {bwd, c.b.output(bwd, 1, "dk"), c.b.output(bwd, 2, "dv")};
  if (in.doc_start) c.input_grads.push_back(nullptr);
  if (in.sinks) c.input_grads.push_back(c.b.output(bwd, 3, "dsinks"));
}
}  // namespace

void sdpa(VjpContext& c) {
  const auto& a = c.node->attrs();
  const AttentionInputs in = attention_inputs(*c.node);
  Node* lse = c.b.output(c.node, 1, "lse");
  attention_grads(c, c.b.sdpa_backward(c.in(0), c.in(1), c.in(2), c.node, lse, c.grad, a.b("causal"), a.f("scale"),
                                       "dq", in.doc_start, in.sinks), in);
}

// o = ring_attention(q, k, v ...): the same from the saved log-sum-exp, with the key/value blocks
// passed around the ring again and dK, dV travelling with them back to their owners.
void ring_attention(VjpContext& c) {
  const auto& a = c.node->attrs();
  const AttentionInputs in = attention_inputs(*c.node);
  Node* lse = c.b.output(c.node, 1, "lse");
  attention_grads(c, c.b.ring_attention_backward(c.in(0), c.in(1), c.in(2), c.node, lse, c.grad, a.b("causal"),
                                                 a.f("scale"), a.s("group"), a.i("group_size"), "dq", in.doc_start,
                                                 in.sinks), in);
}

void cross_entropy_sum(VjpContext& c) {
  c.input_grads[0] =
      c.b.cross_entropy_backward(c.in(0), c.in(1), c.grad, c.node->attrs().i("ignore_index"), "dlogits");
}

// Only the logits (the policy's log-probabilities) take a gradient; labels, slots, the reference,
// the token counts and the norms are data.
void sequence_logps(VjpContext& c) { c.input_grads[0] = c.b.sequence_logps_backward(c.node, c.grad, "dlogits"); }
void dpo_loss(VjpContext& c) { c.input_grads[0] = c.b.dpo_loss_backward(c.node, c.grad, "dlogps"); }
void moe_aux_loss(VjpContext& c) { c.input_grads[0] = c.b.moe_aux_loss_backward(c.node, c.grad, "dstats"); }

// stats [2, E] = moe_router_stats(probs [..., E]): the counts (row 0) are piecewise constant; each
// token's probabilities get the sums' gradient (row 1), broadcast over the tokens.
void moe_router_stats(VjpContext& c) {
  Node* probs = c.in(0);
  Node* dsums = c.b.slice(c.grad, 0, Dim(1), Dim(2), "dsums");  // [1, E], f32 for bf16 probs
  if (dsums->dtype() != probs->dtype()) dsums = c.b.cast(dsums, probs->dtype(), "dsums.cast");
  c.input_grads[0] = c.b.add(c.b.full(probs->shape(), 0.0, probs->dtype(), "dprobs.zero"), dsums, "dprobs");
}

// Masked entries get no gradient: the same mask with 0.
void causal_mask(VjpContext& c) { c.input_grads[0] = c.b.causal_mask(c.grad, 0.0, "dx"); }

// The transpose of an all-to-all is the all-to-all with scatter and gather swapped.
void all_to_all(VjpContext& c) {
  const auto& a = c.node->attrs();
  c.input_grads[0] = c.b.all_to_all(c.grad, static_cast<int>(a.i("gather_dim")), static_cast<int>(a.i("scatter_dim")),
                                    a.s("group"), a.i("group_size"), "dx");
}

// y_r = Σ_i x_i on every rank, so dL/dx_r = Σ_i dL/dy_i: an all-reduce of the gradient.
void all_reduce(VjpContext& c) { c.input_grads[0] = c.b.all_reduce(c.grad, c.node->attrs().s("group"), "dx"); }

// y = the shards x_0 … x_{P-1} side by side, on every rank, so dL/dx_r = Σ_i (dL/dy_i)[shard r]:
// the gradient reduce-scattered (its padding past the whole tensor's elements counts as zero).
void all_gather(VjpContext& c) {
  const auto& a = c.node->attrs();
  c.input_grads[0] = c.b.reduce_scatter(c.grad, a.s("group"), a.i("group_size"), "dx");
}
// The transpose of a reduce-scatter: the shards' gradients gathered into the whole tensor's (in
// the input's dtype when the sum was in a wider one).
void reduce_scatter(VjpContext& c) {
  const auto& a = c.node->attrs();
  Node* g = c.b.all_gather(c.grad, a.s("group"), a.i("group_size"), c.in_shape(0), "dx");
  c.input_grads[0] = g->dtype() == c.in(0)->dtype() ? g : c.b.cast(g, c.in(0)->dtype(), "dx.cast");
}

// The gradient goes back in the input's dtype (a bf16 gradient of an f32 master weight becomes f32).
void cast(VjpContext& c) { c.input_grads[0] = c.b.cast(c.grad, c.in(0)->dtype(), "dx"); }

// Fused residual add + norm: y = norm(s), s = x + (r + rb) (extra output 1; rb, r's bias, the
// optional last input). ds = dy through the norm's backward on the saved s, plus the gradient
// arriving at s itself; dx = dr = drb = ds (autograd sums drb to rb's [C], as the unfused bias
// add's gradient is summed). Either gradient may be missing (c.grad or output_grads[1] null) when
// only one output reaches the loss.
namespace {
void add_norm(VjpContext& c, bool rms) {
  Node* g_s = c.output_grads.size() > 1 ? c.output_grads[1] : nullptr;
  Node* dw = nullptr;
  Node* db = nullptr;
  Node* ds = g_s;
  if (c.grad) {
    Node* s = c.b.output(c.node, 1, "s");
    const double eps = c.node->attrs().f("eps");
    Node* bwd = rms ? c.b.rmsnorm_backward(c.grad, s, c.in(2), eps, "dnorm")
                    : c.b.layernorm_backward(c.grad, s, c.in(2), eps, "dnorm");
    dw = c.b.output(bwd, 1, "dw");
    if (!rms) db = c.b.output(bwd, 2, "db");
    ds = g_s ? c.b.add(bwd, g_s, "ds") : bwd;
  }
  c.input_grads[0] = ds;
  c.input_grads[1] = ds;
  c.input_grads[2] = dw;
  if (!rms) c.input_grads[3] = db;
  if (c.input_grads.size() == (rms ? 4u : 5u)) c.input_grads.back() = ds;  // rb
}
}  // namespace
void add_layernorm(VjpContext& c) { add_norm(c, false); }
void add_rmsnorm(VjpContext& c) { add_norm(c, true); }

// y = gelu_tanh(x + b): one fused backward pass gives dx (= d(x + b)); autograd sums it to b's [C].
void bias_gelu_tanh(VjpContext& c) {
  Node* dx = c.b.bias_gelu_tanh_backward(c.grad, c.in(0), c.in(1), "dx");
  c.input_grads = {dx, dx};
}

// q, k, v = the heads of x + b (qkv_heads): one backward pass lays dq, dk, dv side by side as
// d(x + b) [B, S, 3·N·D] and sums it over B and S into db [3·N·D] (its extra output 1, the bits of
// sum_to). A part whose gradient is missing (it does not reach the loss) gets zeros.
void qkv_heads(VjpContext& c) {
  Node* g[3] = {c.grad, c.output_grads.size() > 1 ? c.output_grads[1] : nullptr,
                c.output_grads.size() > 2 ? c.output_grads[2] : nullptr};
  for (int i = 0; i < 3; ++i)
    if (!g[i])
      g[i] = c.b.full(c.node->shape(), 0.0, c.node->dtype(), "zero" + std::to_string(i));
  Node* dx = c.b.qkv_heads_backward(g[0], g[1], g[2], "dx");
  c.input_grads = {dx, c.b.output(dx, 1, "db")};
}

// y = silu(g) · u: one backward pass gives dg, with du as its extra output.
void swiglu(VjpContext& c) {
  Node* dg = c.b.swiglu_backward(c.grad, c.in(0), c.in(1), "dg");
  c.input_grads = {dg, c.b.output(dg, 1, "du")};
}

// y = swiglu_mlp(x, w_gate, w_up, w_down): one backward node, which recomputes gate and up from
// the saved x chunk by chunk, gives dx, with dw_gate, dw_up, dw_down as its extra outputs.
void swiglu_mlp(VjpContext& c) {
  Node* bwd = c.b.swiglu_mlp_backward(c.grad, c.in(0), c.in(1), c.in(2), c.in(3), "dx");
  c.input_grads = {bwd, c.b.output(bwd, 1, "dw_gate"), c.b.output(bwd, 2, "dw_up"), c.b.output(bwd, 3, "dw_down")};
}

// y = moe_experts(x, probs, the expert weights[, biases]): one backward node, which routes again
// and recomputes each expert's gate and up projections, gives dx, with dprobs (through the top-k
// weights) and each expert weight's and bias's gradient as its extra outputs; it takes the
// forward's attributes (the activation with them). moe_experts_ep likewise, over its expert group.
namespace {
void moe_grads(VjpContext& c, Node* bwd) {
  c.input_grads = {bwd, c.b.output(bwd, 1, "dprobs")};
  for (size_t i = 2; i < c.node->inputs().size(); ++i)
    c.input_grads.push_back(c.b.output(bwd, static_cast<int64_t>(i), "dw" + std::to_string(i - 2)));
}
}  // namespace
void moe_experts(VjpContext& c) {
  std::vector<Node*> in = c.node->inputs();
  if (moe_keeps(*c.node)) in.push_back(c.b.output(c.node, 1, "kept"));  // the projections, not recomputed
  moe_grads(c, c.b.moe_experts_backward(c.grad, in, c.node->attrs(), "dx"));
}
void moe_experts_ep(VjpContext& c) {
  moe_grads(c, c.b.moe_experts_ep_backward(c.grad, c.node->inputs(), c.node->attrs(), "dx"));
}

// loss = linear_cross_entropy_sum(x, w, labels): one backward node, which computes the logits
// again from x chunk by chunk, gives dx, with dw as its extra output; labels get none. A frozen
// head (LoRA) gets weight_grad = false: the node computes no dw (its extra output is empty).
// The DPO form (pair slots fourth) hands its slots and "slots" attribute to the backward, whose
// gradient is then [B, 2, K]; a final logit softcap goes with it too.
void linear_cross_entropy_sum(VjpContext& c) {
  const bool dpo = c.node->inputs().size() == 4;
  Node* bwd = c.b.linear_cross_entropy_backward(c.in(0), c.in(1), c.in(2), c.grad, c.node->attrs().i("ignore_index"),
                                                "dx", dpo ? c.in(3) : nullptr, dpo ? c.node->attrs().i("slots") : 0);
  if (const double cap = linear_ce_softcap(*c.node); cap > 0) bwd->attrs().set("softcap", cap);
  c.input_grads.assign(c.node->inputs().size(), nullptr);
  c.input_grads[0] = bwd;
  if (!c.needs_grad[1]) {
    bwd->attrs().set("weight_grad", false);
    return;
  }
  c.input_grads[1] = c.b.output(bwd, 1, "dw");
}

}  // namespace autosp::vjp
