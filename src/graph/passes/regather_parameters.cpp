// regather_parameters: one gather of a parameter per execution unit that reads it (a unit early),
// and each gradient reduce-scattered as soon as it is complete.
#include <algorithm>

#include "graph/passes/shard_parameters.h"

namespace autosp::passes {

PassResult regather_parameters(Graph& g, const PassContext& ctx) {
  if (!ctx.shard_parameters) return {};
  std::vector<Node*> gathers;
  for (const auto& n : g.nodes())
    if (n->op() == Op::all_gather && n->input(0)->role() == Role::parameter) gathers.push_back(n.get());
  const ParameterUnits units(g, ctx);  // before anything is inserted
  // Places are compared with Graph::before and found with next: positions would rebuild the
  // order after every insertion.
  auto by_position = [&](const Node* a, const Node* b) { return g.before(a, b); };
  bool changed = false;
  for (Node* gather : gathers) {
    // What the units read: the gathered parameter, or under bf16 its one cast.
    Node* tail = gather;
    if (gather->users().size() == 1 && gather->users()[0]->op() == Op::cast) tail = gather->users()[0];
    std::vector<Node*> users = tail->users();
    std::sort(users.begin(), users.end(), by_position);
    for (size_t k = 0; k < users.size();) {
      size_t end = k + 1;
      while (end < users.size() && units.unit_of(users[end]) == units.unit_of(users[k])) ++end;
      if (k > 0) {  // a later unit: its own gather, a unit early, and cast, right before its first use
        Node* first = users[k];
        Node* at = units.prefetch_point(first);
        if (!g.before(gather, at)) at = first;
        Node* copy = g.insert_before(at, Op::all_gather, {gather->input(0)}, gather->attrs(), gather->name());
        Node* copy_tail = copy;
        if (tail != gather)
          copy_tail = g.insert_before(first, Op::cast, {copy}, tail->attrs(), tail->name());
        for (size_t j = k; j < end; ++j)
          for (size_t i = 0; i < users[j]->inputs().size(); ++i)
            if (users[j]->input(i) == tail) g.replace_input(users[j], i, copy_tail);
        changed = true;
      }
      k = end;
    }
  }
  // Autograd reaches the gathers, the graph's first nodes, last: each gradient's reduce_scatter
  // moves up to right after the whole gradient is complete, which then dies there.
  std::vector<Node*> scatters;
  for (const auto& n : g.nodes())
    if (n->op() == Op::reduce_scatter) scatters.push_back(n.get());
  for (Node* rs : scatters) {
    Node* after = g.next(rs->input(0));
    if (after != rs) {
      g.move_before(rs, after);
      changed = true;
    }
  }
  return {changed};
}

}  // namespace autosp::passes
