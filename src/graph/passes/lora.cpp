// lora: the adapters added to the target projections, the rest of the model frozen (lora.h).
#include "graph/passes/lora.h"

#include <algorithm>
#include <map>

#include "tensor/check.h"

namespace autosp {
namespace passes {
namespace {

// The token_index input [B, S] (Role::token_index) beside input_ids, which it shares its dims with.
Node* token_index_input(Graph& g) {
  const std::vector<Node*> ids = g.with_role(Role::input_ids);
  if (ids.size() != 1) throw UsageError("lora: lora_dropout needs the model's one input_ids input");
  return g.insert_after(ids[0], Op::input, {}, {}, "token_index", Role::token_index,
                        TensorType{DType::i64, ids[0]->shape()});
}

// A target's mask seed: the run's seed and the weight's name (FNV-1a), so each adapter (each
// layer and module) drops its own elements, as PEFT's per-module nn.Dropout does.
int64_t dropout_seed(uint64_t seed, const std::string& weight) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : weight) h = (h ^ ch) * 0x100000001b3ull;
  return static_cast<int64_t>(h ^ (seed * 0x9E3779B97F4A7C15ull));
}

}  // namespace

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
  Node* tokens = plan.dropout > 0 ? token_index_input(g) : nullptr;
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
    // xa [..., r] = x · Aᵀ, scaled there (r columns, not out: forward and backward); xab [..., out] = xa · Bᵀ; y + xab
    const Attrs tb{{"trans_a", false}, {"trans_b", true}};
    Node* xd = x;  // PEFT's lora_dropout(x), this target's own mask (its seed)
    if (tokens)
      xd = g.insert_after(mm, Op::dropout, {x, tokens}, {{"p", plan.dropout}, {"seed", dropout_seed(plan.seed, t.weight)}},
                          mm->name() + ".lora_dropout");
    Node* xa = g.insert_after(xd == x ? mm : xd, Op::matmul, {xd, a}, tb, mm->name() + ".lora_a");
    Node* scaled = g.insert_after(xa, Op::scale, {xa}, {{"factor", plan.scale}}, mm->name() + ".lora_scale");
    Node* xab = g.insert_after(scaled, Op::matmul, {scaled, b}, tb, mm->name() + ".lora_b");
    Node* sum = g.insert_after(xab, Op::add, {mm, xab}, {}, mm->name() + ".lora");
    g.replace_all_uses_with(mm, sum, sum);
  }
  return {true};
}

}  // namespace passes
}  // namespace autosp
