// Graph verifier.
#include "graph/verify.h"

#include <algorithm>
#include <unordered_set>

#include "tensor/check.h"

namespace autosp {
namespace {

bool in_graph(const Graph& g, const Node* n) {
  const size_t i = static_cast<size_t>(n->id());
  return i < g.size() && g.nodes()[i].get() == n;
}

// Whether every use list holds exactly the node's readers, with multiplicity: for each value, each
// reader it lists reads it as many times as it is listed, and the lists hold as many entries as
// there are inputs. Linear: checking per input instead counts the value's whole use list once per
// reader, quadratic in a value every layer reads. Only when this fails does the per-node check in
// verify run, to name the node.
bool use_lists_consistent(const Graph& g) {
  std::vector<int> listed(g.size(), 0);  // by reader's position: times the current value lists it
  size_t inputs = 0, users = 0;
  for (const auto& up : g.nodes()) {
    const Node* n = up.get();
    inputs += n->inputs().size();
    users += n->users().size();
    for (const Node* u : n->users()) {
      if (!in_graph(g, u)) return false;
      ++listed[static_cast<size_t>(u->id())];
    }
    for (const Node* u : n->users()) {
      int& times = listed[static_cast<size_t>(u->id())];
      if (times == 0) continue;  // a reader listed twice: checked already
      if (times != std::count(u->inputs().begin(), u->inputs().end(), n)) return false;
      times = 0;
    }
  }
  return inputs == users;
}

// Whether the name index finds every node under its name (then no two share one). Only when this
// fails do the per-node checks in verify run, to say which node and how. Names never change, so a
// node found under its name once stays found unless the index loses or gains entries, which its
// size shows: only the nodes made since the last verify are looked up (ir.h: name_checked).
bool names_consistent(const Graph& g) {
  if (g.name_index_size() != g.size()) return false;
  for (const auto& up : g.nodes())
    if (!up->name_checked() && g.find(up->name()) != up.get()) return false;
  return true;
}

}  // namespace

void verify(const Graph& g, VerifyLevel level) {
  auto bad = [](const Node& n, const std::string& what) {
    throw UsageError(str("verify: node %", n.name(), " (", n.op_name(), "): ", what));
  };
  const bool check_uses = !use_lists_consistent(g), check_names = !names_consistent(g);
  // Types: a node whose type is known to match its shape rule, and whose inputs' types are too,
  // still does (ir.h: type_checked); the others are inferred again. Every one after a new
  // assumption.
  const bool recheck_all = !g.types_checked_under_assumptions();
  auto known = [&](const Node& n) {
    return !recheck_all && n.type_checked() &&
           std::all_of(n.inputs().begin(), n.inputs().end(), [](const Node* i) { return i->type_checked(); });
  };
  std::unordered_set<std::string_view> names;
  for (const auto& up : g.nodes()) {
    const Node& n = *up;
    if (check_names && !names.insert(n.name()).second) bad(n, "duplicate name");
    if (check_names && g.find(n.name()) != &n) bad(n, "name index is stale");
    for (const Node* i : n.inputs()) {
      if (!in_graph(g, i) || i->id() >= n.id()) bad(n, str("input %", i->name(), " does not come before it"));
      if (!check_uses) continue;
      const auto& iu = i->users();
      if (std::count(iu.begin(), iu.end(), &n) != std::count(n.inputs().begin(), n.inputs().end(), i))
        bad(n, str("use list of %", i->name(), " is out of date"));
    }
    if (check_uses)
      for (const Node* u : n.users())
        if (std::find(u->inputs().begin(), u->inputs().end(), &n) == u->inputs().end())
          bad(n, str("lists user %", u->name(), " which does not use it"));
    if ((n.op() == Op::input || n.op() == Op::parameter) && !n.inputs().empty()) bad(n, "a leaf with inputs");
    if (n.op() == Op::parameter && n.role() != Role::parameter && n.role() != Role::frozen)
      bad(n, "parameter without the parameter or frozen role");
    // Its type, attributes and inputs as a full verify (or its making) found them: nothing below
    // can have changed.
    if (known(n)) continue;
    for (const auto& d : n.shape())
      if (d.is_const() && d.value() < 0) bad(n, str("negative dim in ", n.type().str()));
    if (level == VerifyLevel::structure) {
      for (const auto& a : op_required_attrs(n.op()))
        if (!n.attrs().has(a)) bad(n, str("missing attribute '", a, "'"));
      const int arity = op_info(n.op()).arity, optional = op_info(n.op()).optional;
      const int given = static_cast<int>(n.inputs().size());
      if (arity >= 0 && (given < arity || given > arity + optional))
        bad(n, optional == 0 ? str("expected ", arity, " inputs") : str("expected ", arity, " to ", arity + optional, " inputs"));
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
  }
  for (const Node* o : g.outputs())
    if (!in_graph(g, o)) throw UsageError(str("verify: output %", o->name(), " is not in the graph"));
  g.mark_checked(/*types=*/level == VerifyLevel::full);
}

}  // namespace autosp
