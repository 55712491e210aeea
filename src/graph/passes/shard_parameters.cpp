// shard_parameters: parameters become shards, gathered before their first use (a unit early).
#include "graph/passes/shard_parameters.h"

#include <algorithm>

#include "graph/autograd.h"
#include "graph/passes/expert_parallel.h"  // expert_of
#include "tensor/check.h"
#include "tensor/tensor.h"  // shard_numel

namespace autosp {

ParameterUnits::ParameterUnits(const Graph& g, const PassContext& ctx) {
  const size_t backward = backward_begin(g);
  const ScopeIndex scopes(ctx.layer_scopes);
  int unit = 0, scope = -1;
  node_at_.reserve(g.size());
  unit_at_.reserve(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    Node* n = g.nodes()[i].get();
    bool starts = i == backward;
    if (starts) scope = -1;
    std::string_view name = n->name();
    if (name.starts_with("d.")) name.remove_prefix(2);
    const int s = scopes.first(name);
    // Layers run in order in the forward and in reverse in the backward; a node named after an
    // earlier layer (a fused op's extra output keeps the residual's name) starts nothing, and an
    // extra output belongs with the node that made it.
    const bool later = i < backward ? s > scope : s >= 0 && (scope < 0 || s < scope);
    if (n->op() != Op::output && s >= 0 && later) {
      starts = true;
      scope = s;
    }
    if (starts && i > 0) ++unit;  // one new unit, whatever started it
    if (static_cast<size_t>(unit) == first_of_.size()) first_of_.push_back(n);
    node_at_.push_back(n);
    unit_at_.push_back(unit);
  }
}

int ParameterUnits::unit_of(const Node* n) const {
  const auto i = static_cast<size_t>(n->id());
  AUTOSP_ASSERT(i < node_at_.size() && node_at_[i] == n, "node ", n->name(), " was made or renumbered after its units");
  return unit_at_[i];
}

Node* ParameterUnits::prefetch_point(const Node* reader) const {
  const int unit = unit_of(reader);
  return unit > 0 ? first_of_[static_cast<size_t>(unit - 1)] : const_cast<Node*>(reader);
}

namespace passes {

PassResult shard_parameters(Graph& g, const PassContext& ctx) {
  if (!ctx.shard_parameters) return {};
  const ParameterUnits units(g, ctx);  // before anything moves
  // LoRA's frozen base is sharded and gathered alike; autograd gives it no reduce-scatter.
  std::vector<Node*> params = g.with_role(Role::parameter), frozen = g.with_role(Role::frozen);
  params.insert(params.end(), frozen.begin(), frozen.end());
  for (Node* p : params) {
    // Under expert parallelism an expert is sharded over the ranks holding it (decision 185).
    const bool expert = ctx.ep_size > 1 && expert_of(p->name()) >= 0;
    const std::string group = expert ? "ep_replica" : "world";
    const int64_t ranks = expert ? ctx.world_size / ctx.ep_size : ctx.world_size;
    const TensorType whole = p->type();
    int64_t numel = 1;
    for (const Dim& d : whole.shape) numel *= d.value();
    p->set_type({whole.dtype, {Dim(shard_numel(numel, ranks))}});
    if (p->users().empty()) continue;
    // Places are compared with Graph::before: positions would rebuild the order after every edit.
    Node* first_user = *std::min_element(p->users().begin(), p->users().end(),
                                         [&](const Node* a, const Node* b) { return g.before(a, b); });
    // Prefetch: the gather goes to the start of the unit before the first user's (the shard, a
    // leaf, moves before it when it comes later).
    Node* at = units.prefetch_point(first_user);
    if (g.before(at, p)) g.move_before(p, at);
    // Under mixed precision the parameter's one reader is its cast to the compute dtype: the shard
    // is cast, right before the gather, and the narrow copy gathered (half of f32's bytes on the
    // wire and gathered; the cast is elementwise, so this equals the cast of the gathered f32).
    Node* src = p;
    if (p->users().size() == 1 && p->users()[0]->op() == Op::cast && dtype_size(p->users()[0]->dtype()) < dtype_size(p->dtype())) {
      src = p->users()[0];
      src->set_type({src->dtype(), p->shape()});
      if (at == src) at = g.next(src);
      g.move_before(src, at);
    }
    Node* gather = g.insert_before(at, Op::all_gather, {src},
                                   {{"group", group}, {"group_size", ranks}, {"shape", whole.shape}},
                                   p->name() + ".gather");
    g.replace_all_uses_with(src, gather, gather);
  }
  return {true};
}

}  // namespace passes
}  // namespace autosp
