// fuse_elementwise (see the header). A fused node is named after the node it replaces with
// ".fused"; the residual sum it also produces is `output(fused, 1)` named "<add>.s".
//
// Conditions, so the rewrite is exact and never costs memory traffic:
// - add → norm: the add is the norm's input 0, both add operands have the add's shape (no
//   broadcast), and every other user of the add comes after the norm (the sum is then read from
//   the extra output, which is placed right after the fused node).
// - add → gelu_tanh: one add operand is a rank-1 [C] bias matching the last dim, the other has the
//   add's shape, and the gelu is the add's only user (otherwise the sum is still materialised).
// - add → norm only with fuse_residual_norms (off under activation checkpointing): a fused node
//   spanning two layers makes both keep extra checkpoints, and inside a layer the recomputed sum
//   can no longer be written over its dying input (the memory plan does that for a primary output
//   only), so either way the checkpointed run would hold one more [B, S, C] buffer.
// - silu → mul: the silu is one mul operand and has no other user, the other operand (up) has the
//   mul's shape (no broadcast). The silu's output is then never stored (the backward recomputes it
//   from the gate, which it reads anyway).
#include "graph/passes/fuse_elementwise.h"

namespace autosp {
namespace {

bool same_shape(const Node* a, const Node* b) { return a->shape() == b->shape(); }

bool fuse_add_norm(Graph& g, Node* norm) {
  Node* a = norm->input(0);
  if (a->op() != Op::add || !same_shape(a->input(0), a) || !same_shape(a->input(1), a)) return false;
  for (Node* u : a->users())
    if (u != norm && g.before(u, norm)) return false;
  const bool rms = norm->op() == Op::rmsnorm;
  std::vector<Node*> ins = {a->input(0), a->input(1), norm->input(1)};
  if (!rms) ins.push_back(norm->input(2));
  Node* fused = g.insert_after(norm, rms ? Op::add_rmsnorm : Op::add_layernorm, ins, norm->attrs(),
                               norm->name() + ".fused", norm->role());
  g.replace_all_uses_with(norm, fused, fused);
  g.erase(norm);
  if (!a->users().empty() || g.is_output(a)) {
    Node* s = g.insert_after(fused, Op::output, {fused}, {{"index", int64_t{1}}}, a->name() + ".s", a->role());
    g.replace_all_uses_with(a, s, s);
  }
  g.erase(a);
  return true;
}

bool fuse_bias_gelu(Graph& g, Node* gelu) {
  Node* a = gelu->input(0);
  if (a->op() != Op::add || a->users().size() != 1 || g.is_output(a)) return false;
  auto is_bias = [&](const Node* b) { return b->shape().size() == 1 && b->shape()[0] == a->shape().back(); };
  Node *x = a->input(0), *b = a->input(1);
  if (!is_bias(b) || !same_shape(x, a)) std::swap(x, b);
  if (!is_bias(b) || !same_shape(x, a) || a->shape().size() < 2) return false;
  Node* fused = g.insert_after(gelu, Op::bias_gelu_tanh, {x, b}, {}, gelu->name() + ".fused", gelu->role());
  g.replace_all_uses_with(gelu, fused, fused);
  g.erase(gelu);
  g.erase(a);
  return true;
}

bool fuse_swiglu(Graph& g, Node* silu) {
  if (silu->users().size() != 1 || g.is_output(silu)) return false;
  Node* m = silu->users().front();
  if (m->op() != Op::mul) return false;
  Node* up = m->input(0) == silu ? m->input(1) : m->input(0);
  if (up == silu || !same_shape(up, m) || !same_shape(silu, m)) return false;
  Node* fused = g.insert_after(m, Op::swiglu, {silu->input(0), up}, {}, m->name() + ".fused", m->role());
  g.replace_all_uses_with(m, fused, fused);
  g.erase(m);
  g.erase(silu);
  return true;
}

}  // namespace

namespace passes {

PassResult fuse_elementwise(Graph& g, const PassContext& ctx) {
  PassResult res;
  std::vector<Node*> candidates;
  for (const auto& n : g.nodes()) {
    const bool norm = n->op() == Op::layernorm || n->op() == Op::rmsnorm;
    if (n->op() == Op::gelu_tanh || n->op() == Op::silu || (norm && ctx.fuse_residual_norms))
      candidates.push_back(n.get());
  }
  for (Node* n : candidates) {
    const bool fused = n->op() == Op::gelu_tanh ? fuse_bias_gelu(g, n)
                       : n->op() == Op::silu    ? fuse_swiglu(g, n)
                                                : fuse_add_norm(g, n);
    res.changed = res.changed || fused;
  }
  return res;
}

}  // namespace passes

}  // namespace autosp
