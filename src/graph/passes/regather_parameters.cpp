// regather_parameters: one gather of a parameter per execution unit that reads it (a unit early),
// and each gradient reduce-scattered as soon as it is complete.
#include <algorithm>

#include "graph/passes/shard_parameters.h"

namespace autosp::passes {

PassResult regather_parameters(Graph& g, const PassContext& ctx) {
  if (!ctx.shard_parameters) return {};
  std::vector<Node*> gathers, scatters;
  // A parameter's gather reads the shard, or under mixed precision the shard's cast
  // (shard_parameters).
  auto shard_of = [](const Node* gather) {
    const Node* in = gather->input(0);
    return in->op() == Op::cast ? in->input(0) : in;
  };
  for (const auto& n : g.nodes()) {
    if (n->op() == Op::all_gather &&
        (shard_of(n.get())->role() == Role::parameter || shard_of(n.get())->role() == Role::frozen))
      gathers.push_back(n.get());
    if (n->op() == Op::reduce_scatter) scatters.push_back(n.get());  // the gradients' (none is inserted below)
  }
  const ParameterUnits units(g, ctx);  // before anything is inserted
  // Places are compared with Graph::before and found with next: positions would rebuild the
  // order after every insertion.
  auto by_position = [&](const Node* a, const Node* b) { return g.before(a, b); };
  bool changed = false;
  for (Node* gather : gathers) {
    // What the units read: the gathered parameter, or under bf16 its one cast.
    Node* tail = gather;
    if (gather->users().size() == 1 && gather->users()[0]->op() == Op::cast) tail = gather->users()[0];
    Node* head = gather->input(0);  // the shard, or its cast
    std::vector<Node*> users = tail->users();
    std::sort(users.begin(), users.end(), by_position);
    Node* current = tail;  // the copy the previous unit read
    for (size_t k = 0; k < users.size();) {
      size_t end = k + 1;
      while (end < users.size() && units.unit_of(users[end]) == units.unit_of(users[k])) ++end;
      // A later unit: its own gather, a unit early, and cast, right before its first use. Right
      // after the previous reading unit (the LM head's forward, then its backward), it reads the
      // previous copy instead: a gather a unit early would hold two copies at once.
      if (k > 0 && units.unit_of(users[k]) == units.unit_of(users[k - 1]) + 1) {
        if (current != tail) {
          for (size_t j = k; j < end; ++j)
            for (size_t i = 0; i < users[j]->inputs().size(); ++i)
              if (users[j]->input(i) == tail) g.replace_input(users[j], i, current);
          changed = true;
        }
      } else if (k > 0) {
        Node* first = users[k];
        Node* at = units.prefetch_point(first);
        if (!g.before(gather, at)) at = first;
        Node* from = head;
        if (head != shard_of(gather))  // the shard's cast, again
          from = g.insert_before(at, Op::cast, {head->input(0)}, head->attrs(), head->name());
        Node* copy = g.insert_before(at, Op::all_gather, {from}, gather->attrs(), gather->name());
        Node* copy_tail = copy;
        if (tail != gather)
          copy_tail = g.insert_before(first, Op::cast, {copy}, tail->attrs(), tail->name());
        for (size_t j = k; j < end; ++j)
          for (size_t i = 0; i < users[j]->inputs().size(); ++i)
            if (users[j]->input(i) == tail) g.replace_input(users[j], i, copy_tail);
        current = copy_tail;
        changed = true;
      }
      k = end;
    }
  }
  // Autograd reaches the gathers, the graph's first nodes, last: each gradient's reduce_scatter
  // moves up to right after the whole gradient is complete, which then dies there.
  // A gather of a cast shard differentiates into cast(reduce_scatter(dW)): summed over the ranks
  // in the compute dtype. Gradients are summed in the master dtype, as the other stages do: one
  // reduce_scatter(dW, sum_dtype=f32), whose launcher casts dW to f32 in bounded pieces (no whole
  // f32 copy of the gradient; decision 102). It takes the cast's name and role.
  for (Node* rs : scatters) {
    if (rs->users().size() != 1 || rs->users()[0]->op() != Op::cast) continue;
    Node* down = rs->users()[0];
    if (down->dtype() != DType::f32 || rs->dtype() != DType::bf16) continue;
    const Role role = down->role();
    g.replace_all_uses_with(down, rs);
    g.erase(down);
    rs->attrs().set("sum_dtype", std::string("f32"));
    rs->set_type(infer_type(*rs, g.assumptions()));
    rs->set_role(role);
    changed = true;
  }
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
