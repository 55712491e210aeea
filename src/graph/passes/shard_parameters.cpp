// shard_parameters: parameters become shards, gathered before their first use (a unit early).
#include "graph/passes/shard_parameters.h"

#include <algorithm>
#include <unordered_map>

#include "graph/autograd.h"

namespace autosp {

std::vector<int> parameter_units(const Graph& g, const PassContext& ctx) {
  const size_t backward = backward_begin(g);
  std::vector<int> units(g.size());
  int unit = 0, scope = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    const Node& n = *g.nodes()[i];
    if (i == backward && i > 0) {
      ++unit;
      scope = -1;
    }
    std::string_view name = n.name();
    if (name.starts_with("d.")) name.remove_prefix(2);
    int s = -1;
    for (size_t k = 0; k < ctx.layer_scopes.size() && s < 0; ++k)
      if (name.starts_with(ctx.layer_scopes[k])) s = static_cast<int>(k);
    // Layers run in order in the forward and in reverse in the backward; a node named after an
    // earlier layer (a fused op's extra output keeps the residual's name) starts nothing, and an
    // extra output belongs with the node that made it.
    const bool later = i < backward ? s > scope : s >= 0 && (scope < 0 || s < scope);
    if (n.op() != Op::output && s >= 0 && later) {
      if (i > 0) ++unit;
      scope = s;
    }
    units[i] = unit;
  }
  return units;
}

namespace passes {

PassResult shard_parameters(Graph& g, const PassContext& ctx) {
  if (ctx.zero_stage != 3 || ctx.world_size <= 1) return {};
  const std::vector<int> units = parameter_units(g, ctx);
  // The first node of each unit, before anything moves.
  std::vector<Node*> first_of(static_cast<size_t>(units.back()) + 1, nullptr);
  std::unordered_map<const Node*, int> unit_of;
  for (size_t i = g.size(); i-- > 0;) {
    first_of[static_cast<size_t>(units[i])] = g.nodes()[i].get();
    unit_of[g.nodes()[i].get()] = units[i];
  }
  for (Node* p : g.with_role(Role::parameter)) {
    const TensorType whole = p->type();
    int64_t numel = 1;
    for (const Dim& d : whole.shape) numel *= d.value();
    const int64_t shard = (numel + ctx.world_size - 1) / ctx.world_size;
    p->set_type({whole.dtype, {Dim(shard)}});
    if (p->users().empty()) continue;
    Node* first_user = *std::min_element(p->users().begin(), p->users().end(),
                                         [&](const Node* a, const Node* b) { return g.position(a) < g.position(b); });
    // Prefetch: the gather goes to the start of the unit before the first user's (the shard, a
    // leaf, moves before it when it comes later).
    Node* at = first_user;
    for (int u = unit_of.at(first_user) - 1; u >= 0; --u)
      if (Node* start = first_of[static_cast<size_t>(u)]) {
        at = start;
        break;
      }
    if (g.position(p) > g.position(at)) g.move_before(p, at);
    Node* gather = g.insert_after(g.nodes()[g.position(at) - 1].get(), Op::all_gather, {p},
                                  {{"group", std::string("world")}, {"group_size", ctx.world_size}, {"shape", whole.shape}},
                                  p->name() + ".gather");
    g.replace_all_uses_with(p, gather, gather);
  }
  return {true};
}

}  // namespace passes
}  // namespace autosp
