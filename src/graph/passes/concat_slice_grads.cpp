// concat_slice_grads (see the header).
//
// A chain is an add whose operands are slice_backwards or further adds of the chain; every inner
// node has the chain as its only user and is not a graph output, and every node has the add's
// shape. The slice_backwards must share dim and size, and their [start, end) must tile [0, size):
// the first starts at 0, each next starts where the previous ends (compared under the graph's
// shape assumptions, so symbolic bounds work), the last ends at size.
#include "graph/passes/concat_slice_grads.h"

#include <algorithm>
#include <unordered_set>

#include "graph/builder.h"
#include "graph/ops.h"

namespace autosp {
namespace {

// The chain's leaves under `n` (an operand of the chain), or false where the chain breaks.
bool leaves(const Graph& g, Node* n, const Node* parent, std::vector<Node*>& out, std::vector<Node*>& inner) {
  if (n->users().size() != 1 || n->users()[0] != parent || g.is_output(n) || n->shape() != parent->shape())
    return false;
  if (n->op() == Op::slice_backward) {
    out.push_back(n);
    return true;
  }
  if (n->op() != Op::add) return false;
  inner.push_back(n);
  return leaves(g, n->input(0), n, out, inner) && leaves(g, n->input(1), n, out, inner);
}

// Rewrites the chain rooted at `root` into a concat; the chain's inner adds go to `inner`.
bool rewrite(Graph& g, Node* root, std::vector<Node*>& inner) {
  std::vector<Node*> slices;
  if (root->input(0) == root->input(1) || !leaves(g, root->input(0), root, slices, inner) ||
      !leaves(g, root->input(1), root, slices, inner))
    return false;
  const ShapeContext ctx{&g.assumptions()};
  const Attrs& a0 = slices[0]->attrs();
  const int64_t dim = a0.i("dim");
  for (Node* s : slices)
    if (s->attrs().i("dim") != dim || !ctx.same(s->attrs().dim("size"), a0.dim("size"))) return false;
  // Order the slices by start: each must begin where the previous ended, from 0 to size.
  std::vector<Node*> order;
  Dim at = Dim(0);
  while (order.size() < slices.size()) {
    auto next = std::find_if(slices.begin(), slices.end(), [&](Node* s) {
      return std::find(order.begin(), order.end(), s) == order.end() && ctx.same(s->attrs().dim("start"), at);
    });
    if (next == slices.end()) return false;
    order.push_back(*next);
    at = (*next)->attrs().dim("end");
  }
  if (!ctx.same(at, a0.dim("size"))) return false;

  std::vector<Node*> parts;
  for (Node* s : order) parts.push_back(s->input(0));
  Node* cat = g.insert_after(root, Op::concat, parts, {{"dim", dim}}, root->name() + ".concat", root->role());
  g.replace_all_uses_with(root, cat, cat);
  g.erase(root);
  for (Node* n : inner) g.erase(n);  // outermost first: each has no user left when its turn comes
  for (Node* s : slices) g.erase(s);
  return true;
}

}  // namespace

namespace passes {

PassResult concat_slice_grads(Graph& g, const PassContext&) {
  PassResult res;
  std::vector<Node*> adds;
  for (const auto& n : g.nodes())
    if (n->op() == Op::add) adds.push_back(n.get());
  // Outermost adds last in execution order: visit from the end, so a chain is rewritten from its
  // root and its inner adds (erased with it) are never visited.
  std::unordered_set<const Node*> erased;
  for (auto it = adds.rbegin(); it != adds.rend(); ++it) {
    if (erased.contains(*it)) continue;
    std::vector<Node*> inner;
    if (!rewrite(g, *it, inner)) continue;
    erased.insert(inner.begin(), inner.end());
    res.changed = true;
  }
  return res;
}

}  // namespace passes

}  // namespace autosp
