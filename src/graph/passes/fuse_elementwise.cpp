// fuse_elementwise (see the header). A fused node is named after the node it replaces with
// ".fused"; the residual sum it also produces is `output(fused, 1)` named "<add>.s".
//
// Conditions, so the rewrite is exact and never costs memory traffic:
// - add → norm: the add is the norm's input 0, both add operands have the add's shape (no
//   broadcast), and every other user of the add comes after the norm (the sum is then read from
//   the extra output, which is placed right after the fused node).
// - add → norm taking in its residual branch's bias add (with fuse_residual_bias: CPU programs):
//   one operand of the residual add is p = add(m, b [C]) with m of p's shape, p has no user but
//   the residual add and is no graph output; the fused node then reads m and b (its optional last
//   input rb) and computes s = x + (m + b), the two roundings of the unfused adds, so the bits are
//   the same; the backward is unchanged (d(m + b) = ds, summed to b's [C]).
// - add → gelu_tanh: one add operand is a rank-1 [C] bias matching the last dim, the other has the
//   add's shape, and the gelu is the add's only user (otherwise the sum is still materialised).
// - add → norm only with fuse_residual_norms (off under activation checkpointing): a fused node
//   spanning two layers makes both keep extra checkpoints, and inside a layer the recomputed sum
//   can no longer be written over its dying input (the memory plan does that for a primary output
//   only), so either way the checkpointed run would hold one more [B, S, C] buffer.
// - silu → mul: the silu is one mul operand and has no other user, the other operand (up) has the
//   mul's shape (no broadcast). The silu's output is then never stored (the backward recomputes it
//   from the gate, which it reads anyway).
// - add → 3 slices → reshape → transpose ⇒ qkv_heads (with fuse_qkv_heads: CPU programs): the add
//   is x [B, S, 3C] (f32 or f64) + a rank-1 bias [3C] and has exactly three users, slices of the
//   last dim at [0, C), [C, 2C), [2C, 3C) with constant bounds; each slice's only user is a reshape
//   to [B, S, N, D] (the same N for all three, N·D = C) and each reshape's only user a
//   transpose(1, 2); no node of the chain is a graph output. The transposes' users then read q
//   from the fused node and k, v from its extra outputs 1, 2, which are placed right after it.
//   The values are the same bits (x + b rounded once, then moved); the backward's transposes and
//   concat become one qkv_heads_backward.
#include "graph/passes/fuse_elementwise.h"

namespace autosp {
namespace {

bool same_shape(const Node* a, const Node* b) { return a->shape() == b->shape(); }

bool is_bias_of(const Node* b, const Node* a) { return b->shape().size() == 1 && b->shape()[0] == a->shape().back(); }

// The bias add p = add(m, b [C]) that a residual branch ends with (an output projection's), if it
// can be taken into the fused node: p has the sum's shape and no user but the residual add, and
// is no graph output. Then sets *m and *b.
bool residual_bias(const Graph& g, Node* p, Node* a, Node** m, Node** b) {
  if (p->op() != Op::add || p->users().size() != 1 || p->users().front() != a || g.is_output(p)) return false;
  Node *pm = p->input(0), *pb = p->input(1);
  if (!is_bias_of(pb, p) || !same_shape(pm, p)) std::swap(pm, pb);
  if (!is_bias_of(pb, p) || !same_shape(pm, p) || !same_shape(p, a)) return false;
  *m = pm, *b = pb;
  return true;
}

bool fuse_add_norm(Graph& g, Node* norm, bool with_bias) {
  Node* a = norm->input(0);
  if (a->op() != Op::add || !same_shape(a->input(0), a) || !same_shape(a->input(1), a)) return false;
  for (Node* u : a->users())
    if (u != norm && g.before(u, norm)) return false;
  const bool rms = norm->op() == Op::rmsnorm;
  Node *x = a->input(0), *r = a->input(1), *m = nullptr, *rb = nullptr;
  if (with_bias && !residual_bias(g, r, a, &m, &rb) && residual_bias(g, x, a, &m, &rb)) std::swap(x, r);
  std::vector<Node*> ins = {x, rb ? m : r, norm->input(1)};
  if (!rms) ins.push_back(norm->input(2));
  if (rb) ins.push_back(rb);
  Node* fused = g.insert_after(norm, rms ? Op::add_rmsnorm : Op::add_layernorm, ins, norm->attrs(),
                               norm->name() + ".fused", norm->role());
  g.replace_all_uses_with(norm, fused, fused);
  g.erase(norm);
  if (!a->users().empty() || g.is_output(a)) {
    Node* s = g.insert_after(fused, Op::output, {fused}, {{"index", int64_t{1}}}, a->name() + ".s", a->role());
    g.replace_all_uses_with(a, s, s);
  }
  g.erase(a);
  if (rb) g.erase(r);
  return true;
}

bool fuse_bias_gelu(Graph& g, Node* gelu) {
  Node* a = gelu->input(0);
  if (a->op() != Op::add || a->users().size() != 1 || g.is_output(a)) return false;
  Node *x = a->input(0), *b = a->input(1);
  if (!is_bias_of(b, a) || !same_shape(x, a)) std::swap(x, b);
  if (!is_bias_of(b, a) || !same_shape(x, a) || a->shape().size() < 2) return false;
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

// The transpose(1, 2) of reshape(slice) [B, S, N, D] for one slice of the qkv add (null if the
// chain is not exactly that); sets *heads to N.
Node* head_transpose(const Graph& g, Node* slice, const Node* a, int64_t* heads) {
  if (slice->users().size() != 1 || g.is_output(slice)) return nullptr;
  Node* r = slice->users().front();
  if (r->op() != Op::reshape || r->users().size() != 1 || g.is_output(r)) return nullptr;
  const SymShape& rs = r->shape();
  if (rs.size() != 4 || !(rs[0] == a->shape()[0]) || !(rs[1] == a->shape()[1]) || !rs[2].is_const()) return nullptr;
  Node* t = r->users().front();
  if (t->op() != Op::transpose || g.is_output(t)) return nullptr;
  const int64_t d0 = t->attrs().i("dim0"), d1 = t->attrs().i("dim1");
  if (!((d0 == 1 && d1 == 2) || (d0 == 2 && d1 == 1))) return nullptr;
  *heads = rs[2].value();
  return t;
}

bool fuse_qkv_heads(Graph& g, Node* a) {
  if (a->users().size() != 3 || g.is_output(a) || a->shape().size() != 3 || !a->shape()[2].is_const()) return false;
  if (a->dtype() != DType::f32 && a->dtype() != DType::f64) return false;
  Node *x = a->input(0), *b = a->input(1);
  const int64_t W = a->shape()[2].value();
  if (!is_bias_of(b, a) || !same_shape(x, a)) std::swap(x, b);
  if (!is_bias_of(b, a) || !same_shape(x, a) || W % 3 != 0) return false;
  const int64_t C = W / 3;
  Node* heads_of[3] = {nullptr, nullptr, nullptr};
  int64_t N = -1;
  for (Node* s : a->users()) {
    if (s->op() != Op::slice || s->input(0) != a) return false;
    const int64_t dim = s->attrs().i("dim");
    const Dim &start = s->attrs().dim("start"), &end = s->attrs().dim("end");
    if ((dim != 2 && dim != -1) || !start.is_const() || !end.is_const()) return false;
    const int64_t p = start.value() / C;
    if (start.value() % C != 0 || p < 0 || p > 2 || end.value() != start.value() + C || heads_of[p]) return false;
    int64_t n = 0;
    heads_of[p] = head_transpose(g, s, a, &n);
    if (!heads_of[p] || (N != -1 && n != N) || n <= 0 || C % n != 0) return false;
    N = n;
  }
  Node* fused = g.insert_after(a, Op::qkv_heads, {x, b}, {{"heads", N}}, heads_of[0]->name() + ".h", a->role());
  Node* k = g.insert_after(fused, Op::output, {fused}, {{"index", int64_t{1}}}, heads_of[1]->name() + ".h", Role::none);
  Node* v = g.insert_after(k, Op::output, {fused}, {{"index", int64_t{2}}}, heads_of[2]->name() + ".h", Role::none);
  Node* parts[3] = {fused, k, v};
  std::vector<Node*> dead;
  for (int p = 0; p < 3; ++p) {
    Node* t = heads_of[p];
    g.replace_all_uses_with(t, parts[p], parts[p]);
    Node* r = t->input(0);
    dead.insert(dead.end(), {t, r, r->input(0)});
  }
  for (Node* n : dead) g.erase(n);
  g.erase(a);
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
                                                : fuse_add_norm(g, n, ctx.fuse_residual_bias);
    res.changed = res.changed || fused;
  }
  if (!ctx.fuse_qkv_heads) return res;
  // The adds that remain (the fusions above erase theirs), collected before any is erased here.
  std::vector<Node*> adds;
  for (const auto& n : g.nodes())
    if (n->op() == Op::add) adds.push_back(n.get());
  for (Node* a : adds) res.changed = fuse_qkv_heads(g, a) || res.changed;
  return res;
}

}  // namespace passes

}  // namespace autosp
