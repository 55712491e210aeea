// Graph verifier.
#include "graph/verify.h"

#include <algorithm>
#include <set>

#include "tensor/check.h"

namespace autosp {

void verify(const Graph& g, VerifyLevel level) {
  auto bad = [](const Node& n, const std::string& what) {
    throw UsageError(str("verify: node %", n.name(), " (", n.op_name(), "): ", what));
  };
  std::set<const Node*> seen;
  std::set<std::string> names;
  for (const auto& up : g.nodes()) {
    const Node& n = *up;
    if (!names.insert(n.name()).second) bad(n, "duplicate name");
    if (g.find(n.name()) != &n) bad(n, "name index is stale");
    for (const Node* i : n.inputs()) {
      if (!seen.count(i)) bad(n, str("input %", i->name(), " does not come before it"));
      const auto& iu = i->users();
      if (std::count(iu.begin(), iu.end(), &n) != std::count(n.inputs().begin(), n.inputs().end(), i))
        bad(n, str("use list of %", i->name(), " is out of date"));
    }
    for (const Node* u : n.users())
      if (std::find(u->inputs().begin(), u->inputs().end(), &n) == u->inputs().end())
        bad(n, str("lists user %", u->name(), " which does not use it"));
    if ((n.op() == Op::input || n.op() == Op::parameter) && !n.inputs().empty()) bad(n, "a leaf with inputs");
    if (n.op() == Op::parameter && n.role() != Role::parameter) bad(n, "parameter without the parameter role");
    for (const auto& d : n.shape())
      if (d.is_const() && d.value() < 0) bad(n, str("negative dim in ", n.type().str()));
    if (level == VerifyLevel::structure) {
      for (const auto& a : op_required_attrs(n.op()))
        if (!n.attrs().has(a)) bad(n, str("missing attribute '", a, "'"));
      const int arity = op_info(n.op()).arity, optional = op_info(n.op()).optional;
      const int given = static_cast<int>(n.inputs().size());
      if (arity >= 0 && (given < arity || given > arity + optional))
        bad(n, optional == 0 ? str("expected ", arity, " inputs") : str("expected ", arity, " to ", arity + optional, " inputs"));
      seen.insert(&n);
      continue;
    }
    TensorType t;
    try {
      t = infer_type(n, g.assumptions());
    } catch (const UsageError& e) {
      bad(n, e.what());
    }
    if (!(t.dtype == n.dtype() && t.rank() == n.type().rank()))
      bad(n, str("type ", n.type().str(), " but its shape rule gives ", t.str()));
    ShapeContext ctx{&g.assumptions()};
    for (int i = 0; i < t.rank(); ++i)
      if (!ctx.same(t.shape[i], n.shape()[i]))
        bad(n, str("type ", n.type().str(), " but its shape rule gives ", t.str()));
    seen.insert(&n);
  }
  for (const Node* o : g.outputs())
    if (!seen.count(o)) throw UsageError(str("verify: output %", o->name(), " is not in the graph"));
}

}  // namespace autosp
