// expert_parallel (graph/passes/expert_parallel.h): moe_experts → moe_experts_ep over this rank's
// experts, the others' parameters erased.
#include "graph/passes/expert_parallel.h"

#include <string>
#include <vector>

#include "graph/builder.h"
#include "tensor/check.h"

namespace autosp {

int64_t expert_of(std::string_view name) {
  const size_t at = name.find(".experts.");
  if (at == std::string_view::npos) return -1;
  const size_t from = at + 9, end = name.find('.', from);
  int64_t e = 0;
  for (size_t i = from; i < end && i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    e = e * 10 + (name[i] - '0');
  }
  return end == from ? -1 : e;
}

namespace passes {
namespace {

// Erases `n` when nothing reads it, then its inputs that nothing reads any more (a dropped
// expert's parameter, and under mixed precision its cast).
void erase_unread(Graph& g, Node* n) {
  if (!n->users().empty() || op_info(n->op()).collective) return;
  const std::vector<Node*> in = n->inputs();
  g.erase(n);
  for (Node* i : in) erase_unread(g, i);
}

}  // namespace

PassResult expert_parallel(Graph& g, const PassContext& ctx) {
  PassResult res;
  if (ctx.ep_size == 1) return res;
  std::vector<Node*> moe;
  for (const auto& n : g.nodes())
    if (n->op() == Op::moe_experts) moe.push_back(n.get());
  const int64_t G = ctx.ep_size, r = ctx.ep_rank;
  for (Node* n : moe) {
    const std::vector<Node*> in = n->inputs();
    const int64_t per = moe_params_per_expert(*n);  // weights, and gpt-oss's biases
    const int64_t E = static_cast<int64_t>(in.size() - 2) / per;
    if (E % G != 0)
      throw UsageError(str("moe.expert_parallel_size ", G, " does not divide the ", E, " experts of ", n->name()));
    const int64_t L = E / G;
    std::vector<Node*> kept{in[0], in[1]}, dropped;
    for (int64_t which = 0; which < per; ++which)
      for (int64_t e = 0; e < E; ++e) {
        Node* w = in[size_t(2 + which * E + e)];
        (e / L == r ? kept : dropped).push_back(w);
      }
    Attrs a = n->attrs();
    a.set("group", std::string("ep"));
    a.set("group_size", G);
    Node* ep = g.insert_after(n, Op::moe_experts_ep, kept, a, n->name() + ".ep", n->role(), n->type());
    g.replace_all_uses_with(n, ep, ep);
    g.erase(n);
    for (Node* w : dropped) erase_unread(g, w);
    res.changed = true;
  }
  return res;
}

}  // namespace passes
}  // namespace autosp
