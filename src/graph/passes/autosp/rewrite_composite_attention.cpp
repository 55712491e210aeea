// rewrite_composite_attention: attention spelled as ops,
//   s = matmul(q, k, trans_b) → [scale] → [causal_mask(-inf)] → softmax → matmul(·, v)
// with q, k, v [B, N, S, D], becomes one sdpa(q, k, v) node, so the attention all-to-all pass sees
// it and nothing materialises an S×S matrix. Intermediate values used elsewhere block the rewrite
// (the pattern is left alone and shard_seq_dim then rejects it by name).
#include <cmath>

#include "graph/builder.h"
#include "graph/passes/autosp/autosp.h"
#include "graph/passes/dce.h"

namespace autosp::passes {
namespace {

bool only_user(const Node* n, const Node* user) { return n->users().size() == 1 && n->users()[0] == user; }
bool rank4(const Node* n) { return n->type().rank() == 4; }

}  // namespace

PassResult rewrite_composite_attention(Graph& g, const PassContext&) {
  PassResult r;
  std::vector<Node*> softmaxes;
  for (const auto& n : g.nodes())
    if (n->op() == Op::softmax) softmaxes.push_back(n.get());
  for (Node* sm : softmaxes) {
    if (sm->users().size() != 1) continue;
    Node* pv = sm->users()[0];
    if (pv->op() != Op::matmul || pv->input(0) != sm || pv->attrs().b("trans_a") || pv->attrs().b("trans_b")) continue;
    Node* x = sm->input(0);
    bool causal = false;
    double scale = 1.0;
    if (x->op() == Op::causal_mask && only_user(x, sm) && std::isinf(x->attrs().f("value")) && x->attrs().f("value") < 0) {
      causal = true;
      x = x->input(0);
    }
    if (x->op() == Op::scale && only_user(x, causal ? x->users()[0] : sm)) {
      scale = x->attrs().f("factor");
      x = x->input(0);
    }
    if (x->op() != Op::matmul || x->attrs().b("trans_a") || !x->attrs().b("trans_b") || x->users().size() != 1) continue;
    Node *q = x->input(0), *k = x->input(1), *v = pv->input(1);
    if (!rank4(q) || !rank4(k) || !rank4(v)) continue;
    Node* attn = g.insert_after(pv, Op::sdpa, {q, k, v}, {{"causal", causal}, {"scale", scale}}, pv->name() + ".sdpa");
    g.replace_all_uses_with(pv, attn, attn);
    r.changed = true;
  }
  if (r.changed) eliminate_dead_code(g);
  return r;
}

}  // namespace autosp::passes
