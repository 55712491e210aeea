// Activation checkpointing by cloning each layer's forward into the backward.
#include "graph/passes/checkpoint_activations.h"

#include <algorithm>
#include <map>
#include <set>

#include "graph/autograd.h"

namespace autosp::passes {

PassResult checkpoint_activations(Graph& g, const PassContext& ctx) {
  const size_t forward_end = backward_begin(g);
  size_t recomputed = 0;
  for (const std::string& scope : ctx.layer_scopes) {
    // The scope's forward nodes, and those of them that backward nodes read.
    std::vector<Node*> layer;
    std::set<Node*> in_layer, read_by_backward;
    for (size_t i = 0; i < forward_end && i < g.size(); ++i) {
      Node* n = g.nodes()[i].get();
      if (n->name().rfind(scope, 0) != 0 || n->op() == Op::input || n->op() == Op::parameter) continue;
      layer.push_back(n);
      in_layer.insert(n);
    }
    // A value the rest of the forward reads (the layer's output on the residual stream) is the
    // checkpoint: kept, not recomputed.
    auto is_checkpoint = [&](Node* n) {
      for (Node* u : n->users())
        if (g.position(u) < forward_end && !in_layer.count(u)) return true;
      return false;
    };
    for (Node* n : layer) {
      if (is_checkpoint(n)) continue;
      for (Node* u : n->users())
        if (g.position(u) >= forward_end) {
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
        if (g.position(u) >= forward_end && (!first || g.position(u) < g.position(first)))
          first = u;
    Node* at = g.nodes()[g.position(first) - 1].get();
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
      std::vector<Node*> users = n->users();
      for (Node* u : users) {
        if (g.position(u) < forward_end) continue;
        for (size_t k = 0; k < u->inputs().size(); ++k)
          if (u->input(k) == n) g.replace_input(u, k, clone.at(n));
      }
    }
  }
  return {recomputed > 0};
}

}  // namespace autosp::passes
