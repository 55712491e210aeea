// lora: the adapters added to the target projections, the rest of the model frozen (lora.h).
#include "graph/passes/lora.h"

#include <algorithm>
#include <map>

#include "tensor/check.h"

namespace autosp {
namespace passes {

PassResult lora(Graph& g, const PassContext& ctx) {
  const LoraPlan& plan = ctx.lora;
  if (plan.r == 0) return {};
  AUTOSP_ASSERT(plan.r > 0, "LoRA rank ", plan.r);
  for (Node* p : g.with_role(Role::parameter))
    if (std::find(plan.trainable.begin(), plan.trainable.end(), p->name()) == plan.trainable.end())
      p->set_role(Role::frozen);

  std::map<const Node*, const LoraPlan::Target*> target_of;  // weight parameter → its target
  for (const LoraPlan::Target& t : plan.targets) {
    const Node* w = g.find(t.weight);
    if (!w || w->op() != Op::parameter) throw UsageError(str("lora: the model has no parameter ", t.weight));
    target_of[w] = &t;
  }
  std::vector<Node*> matmuls;
  for (const auto& n : g.nodes())
    if (n->op() == Op::matmul && target_of.count(n->input(1))) matmuls.push_back(n.get());
  for (const auto& [w, t] : target_of)
    if (std::none_of(matmuls.begin(), matmuls.end(), [&](const Node* m) { return m->input(1) == w; }))
      throw UsageError(str("lora: no matmul reads ", t->weight, " (a fused op, such as the tiled MLP's, hides it)"));
  std::map<const Node*, std::pair<Node*, Node*>> adapter_of;  // weight → its A and B, made at its first matmul
  for (Node* mm : matmuls) {
    // x [..., in] · W, W [out, in] (trans_b: nn.Linear) or [in, out] (GPT-2's Conv1D) → y [..., out]
    Node* x = mm->input(0);
    Node* w = mm->input(1);
    const LoraPlan::Target& t = *target_of.at(w);
    const bool out_in = mm->attrs().b("trans_b");
    const Dim in = w->shape()[out_in ? 1 : 0], out = w->shape()[out_in ? 0 : 1];
    const Dim r(plan.r);
    auto [it, fresh] = adapter_of.try_emplace(w);
    if (fresh)
      it->second = {g.insert_before(mm, Op::parameter, {}, {}, t.a, Role::parameter, TensorType{w->dtype(), {r, in}}),
                    g.insert_before(mm, Op::parameter, {}, {}, t.b, Role::parameter, TensorType{w->dtype(), {out, r}})};
    auto [a, b] = it->second;
    // xa [..., r] = x · Aᵀ; xab [..., out] = xa · Bᵀ; y + scale · xab
    const Attrs tb{{"trans_a", false}, {"trans_b", true}};
    Node* xa = g.insert_after(mm, Op::matmul, {x, a}, tb, mm->name() + ".lora_a");
    Node* xab = g.insert_after(xa, Op::matmul, {xa, b}, tb, mm->name() + ".lora_b");
    Node* scaled = g.insert_after(xab, Op::scale, {xab}, {{"factor", plan.scale}}, mm->name() + ".lora_scale");
    Node* sum = g.insert_after(scaled, Op::add, {mm, scaled}, {}, mm->name() + ".lora");
    g.replace_all_uses_with(mm, sum, sum);
  }
  return {true};
}

}  // namespace passes
}  // namespace autosp
