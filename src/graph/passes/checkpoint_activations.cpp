// Activation checkpointing by cloning each layer's forward into the backward.
#include "graph/passes/checkpoint_activations.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "graph/autograd.h"

namespace autosp::passes {
namespace {

// The pass inserts in the middle of the graph as it goes, so it compares places with Graph::before
// (O(1) during edits), never with positions, and walks a snapshot of the forward, which no
// insertion reaches: every recomputed node goes into the backward. A node is in the backward when
// it is not before the seed gradient (`Backward`).
struct Backward {
  const Graph& g;
  const Node* seed;  // the backward's first node; null without a backward
  bool has(const Node* n) const { return seed && !g.before(n, seed); }
};

// Whether `in` is still alive at `at` without help: a leaf, or read at `at` or later.
bool alive_at(const Graph& g, const Node* in, const Node* at) {
  if (in->op() == Op::input || in->op() == Op::parameter) return true;
  for (const Node* u : in->users())
    if (!g.before(u, at)) return true;
  return false;
}

// `readers` read `to` wherever they read `from`.
void switch_readers(Graph& g, const std::vector<Node*>& readers, Node* from, Node* to) {
  for (Node* u : readers)
    for (size_t k = 0; k < u->inputs().size(); ++k)
      if (u->input(k) == from) g.replace_input(u, k, to);
}

// The token embedding, a gather from the table by the ids, is the first scope's input and so a
// checkpoint that the backward keeps alive until the first layer's backward. When its inputs stay
// alive that long anyway (leaves, or the ids' slice AutoSP makes, which the embedding backward
// reads), it is computed again right before its first backward reader instead: one cheap gather
// for a [B, S, C] that no longer lives through the backward. A table that dies in the forward (a
// ZeRO-3 gather, a bf16 cast) keeps the value as it was.
size_t rematerialize_embeddings(Graph& g, const std::vector<Node*>& forward, const Backward& backward) {
  size_t count = 0;
  for (Node* n : forward) {
    if (n->op() != Op::embedding) continue;
    std::vector<Node*> readers;
    Node* first = nullptr;
    for (Node* u : n->users())
      if (backward.has(u)) {
        readers.push_back(u);
        if (!first || g.before(u, first)) first = u;
      }
    if (!first) continue;
    if (!std::all_of(n->inputs().begin(), n->inputs().end(), [&](Node* in) { return alive_at(g, in, first); }))
      continue;
    switch_readers(g, readers, n,
                   g.insert_before(first, n->op(), n->inputs(), n->attrs(), n->name() + ".re", Role::none, n->type()));
    ++count;
  }
  return count;
}

// A recomputed value that the rest of the recomputation reads at once and a backward node only
// much later (the norm before the q, k, v projections, whose weight gradients come after the
// attention's backward; the attention output's transpose, read by o_proj again and then by its
// weight gradient after the MLP's backward) would live through everything in between. Where it
// is cheap (a transpose or reshape, a norm: one memory-bound pass or none), it is computed again
// right before that reader, from inputs alive there anyway or from cheap recomputed values
// computed again the same way.
bool cheap(Op op) { return op == Op::transpose || op == Op::reshape || op == Op::rmsnorm || op == Op::layernorm; }

size_t recompute_again_late(Graph& g, const std::map<Node*, Node*>& clone) {
  std::set<Node*> clones;
  std::map<Node*, Node*> orig_of;
  for (const auto& [orig, re] : clone) clones.insert(re), orig_of[re] = orig;
  size_t count = 0;
  // Whether `re` can be computed again right before `at`: cheap, from inputs alive there or
  // themselves computable again (a short chain: transpose then reshape).
  std::function<bool(Node*, Node*, int)> can_redo = [&](Node* re, Node* at, int depth) {
    if (!clones.count(re) || !cheap(re->op()) || depth > 4) return false;
    return std::all_of(re->inputs().begin(), re->inputs().end(),
                       [&](Node* in) { return alive_at(g, in, at) || can_redo(in, at, depth + 1); });
  };
  // `re` computed again right before `at` (can_redo holds; memo per `at`).
  std::map<std::pair<Node*, Node*>, Node*> again;
  std::function<Node*(Node*, Node*)> redo = [&](Node* re, Node* at) -> Node* {
    if (auto it = again.find({re, at}); it != again.end()) return it->second;
    std::vector<Node*> ins;
    for (Node* in : re->inputs()) ins.push_back(alive_at(g, in, at) ? in : redo(in, at));
    ++count;
    return again[{re, at}] =
               g.insert_before(at, re->op(), ins, re->attrs(), orig_of.at(re)->name() + ".re2", Role::none, re->type());
  };
  for (const auto& [orig, re] : clone) {
    if (!cheap(re->op())) continue;
    std::vector<Node*> late;
    Node* first = nullptr;
    bool read_in_recompute = false;
    for (Node* u : re->users()) {
      if (clones.count(u)) {
        read_in_recompute = true;
        continue;
      }
      late.push_back(u);
      if (!first || g.before(u, first)) first = u;
    }
    if (!read_in_recompute || !first || !can_redo(re, first, 0)) continue;
    switch_readers(g, late, re, redo(re, first));
  }
  return count;
}

}  // namespace

PassResult checkpoint_activations(Graph& g, const PassContext& ctx) {
  const size_t forward_end = backward_begin(g);
  const std::vector<Node*> forward = [&] {
    std::vector<Node*> out;
    for (size_t i = 0; i < forward_end; ++i) out.push_back(g.nodes()[i].get());
    return out;
  }();
  const Backward backward{g, forward_end < g.size() ? g.nodes()[forward_end].get() : nullptr};
  // Each scope's forward nodes (leaves aside), in order: one sweep over the forward.
  std::vector<std::vector<Node*>> layers(ctx.layer_scopes.size());
  const ScopeIndex scopes(ctx.layer_scopes);
  for (Node* n : forward)
    if (n->op() != Op::input && n->op() != Op::parameter)
      for (int k : scopes.matches(n->name())) layers[static_cast<size_t>(k)].push_back(n);
  size_t recomputed = 0;
  for (const std::vector<Node*>& layer : layers) {
    // The scope's forward nodes, and those of them that backward nodes read.
    const std::set<Node*> in_layer(layer.begin(), layer.end());
    std::set<Node*> read_by_backward;
    // A value the rest of the forward reads (the layer's output on the residual stream) is the
    // checkpoint: kept, not recomputed.
    auto is_checkpoint = [&](Node* n) {
      for (Node* u : n->users())
        if (!backward.has(u) && !in_layer.count(u)) return true;
      return false;
    };
    for (Node* n : layer) {
      if (is_checkpoint(n)) continue;
      for (Node* u : n->users())
        if (backward.has(u)) {
          read_by_backward.insert(n);
          break;
        }
    }
    if (read_by_backward.empty()) continue;
    // What must be recomputed: the read values and their inputs inside the scope.
    std::set<Node*> needed;
    std::vector<Node*> stack(read_by_backward.begin(), read_by_backward.end());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (!needed.insert(n).second) continue;
      for (Node* in : n->inputs())
        if (in_layer.count(in) && !is_checkpoint(in)) stack.push_back(in);
    }
    // The first backward node that reads the scope: the recomputation goes right before it.
    Node* first = nullptr;
    for (Node* n : read_by_backward)
      for (Node* u : n->users())
        if (backward.has(u) && (!first || g.before(u, first))) first = u;
    Node* at = g.prev(first);
    std::map<Node*, Node*> clone;
    for (Node* n : layer) {
      if (!needed.count(n)) continue;
      std::vector<Node*> ins;
      for (Node* in : n->inputs()) ins.push_back(clone.count(in) ? clone.at(in) : in);
      at = g.insert_after(at, n->op(), ins, n->attrs(), n->name() + ".re", Role::none, n->type());
      clone[n] = at;
      ++recomputed;
    }
    // Backward readers switch to the recomputed values.
    for (Node* n : read_by_backward) {
      std::vector<Node*> backward_users;
      for (Node* u : n->users())
        if (backward.has(u)) backward_users.push_back(u);
      switch_readers(g, backward_users, n, clone.at(n));
    }
    recomputed += recompute_again_late(g, clone);
  }
  recomputed += rematerialize_embeddings(g, forward, backward);
  return {recomputed > 0};
}

}  // namespace autosp::passes
