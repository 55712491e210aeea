// Reverse-mode autograd over the IR.
#include "graph/autograd.h"

#include <algorithm>

#include "graph/passes/dce.h"
#include "tensor/check.h"

namespace autosp {
namespace {

bool same_shape(const Graph& g, const SymShape& a, const SymShape& b) {
  if (a.size() != b.size()) return false;
  ShapeContext ctx{&g.assumptions()};
  for (size_t i = 0; i < a.size(); ++i)
    if (!ctx.same(a[i], b[i])) return false;
  return true;
}

}  // namespace

std::vector<Node*> build_backward(Graph& g, Node* loss, const std::vector<Node*>& params) {
  if (loss->type().rank() != 0) throw UsageError(str("autograd: loss %", loss->name(), " is ", loss->type().str(), ", not a scalar"));
  std::vector<Node*> fwd;
  for (const auto& n : g.nodes()) fwd.push_back(n.get());
  const size_t n = fwd.size();

  // A node needs a gradient when it depends on a parameter and the loss depends on it.
  std::vector<bool> from_param(n, false), to_loss(n, false);
  for (Node* p : params) from_param[g.position(p)] = true;
  for (size_t i = 0; i < n; ++i)
    for (Node* in : fwd[i]->inputs()) from_param[i] = from_param[i] || from_param[g.position(in)];
  to_loss[g.position(loss)] = true;
  for (size_t i = n; i-- > 0;)
    for (Node* u : fwd[i]->users()) to_loss[i] = to_loss[i] || to_loss[g.position(u)];

  Builder b(g);
  std::map<Node*, Node*> grad;
  grad[loss] = g.add(Op::full, {}, {{"shape", SymShape{}}, {"value", 1.0}, {"dtype", std::string(dtype_name(loss->dtype()))}},
                     "d." + loss->name());
  // Gradients of extra outputs, gathered from the `output` nodes that read them: [node][index].
  std::map<Node*, std::vector<Node*>> extra_grad;
  for (size_t i = n; i-- > 0;) {
    Node* node = fwd[i];
    auto it = grad.find(node);
    auto xt = extra_grad.find(node);
    if ((it == grad.end() && xt == extra_grad.end()) || !from_param[i] || !to_loss[i]) continue;
    if (node->op() == Op::input || node->op() == Op::parameter) continue;
    if (node->op() == Op::output && it != grad.end()) {
      // The gradient of an extra output goes to its source node's vjp (output_grads).
      Node* src = node->input(0);
      if (!op_info(src->op()).differentiable_extras)
        throw UsageError(str("autograd: extra output ", node->attrs().i("index"), " of [", src->op_name(), "] %",
                             src->name(), " is on the loss path but not differentiable"));
      const size_t index = static_cast<size_t>(node->attrs().i("index"));
      auto& slots = extra_grad[src];
      if (slots.size() <= index) slots.resize(index + 1, nullptr);
      b.set_prefix("d." + node->name() + ".");
      slots[index] = slots[index] ? b.add(slots[index], it->second, "acc") : it->second;
      continue;
    }
    const OpInfo& info = op_info(node->op());
    if (!info.vjp)
      throw UsageError(str("autograd: [", node->op_name(), "] %", node->name(), " is not differentiable"));
    b.set_prefix("d." + node->name() + ".");
    std::vector<bool> needs;
    for (Node* in : node->inputs()) needs.push_back(from_param[g.position(in)]);
    VjpContext ctx{b, node, it == grad.end() ? nullptr : it->second,
                   xt == extra_grad.end() ? std::vector<Node*>{} : xt->second,
                   std::vector<Node*>(node->inputs().size(), nullptr), std::move(needs)};
    info.vjp(ctx);
    for (size_t k = 0; k < node->inputs().size(); ++k) {
      Node* in = node->input(k);
      Node* gi = ctx.input_grads[k];
      if (!gi || !from_param[g.position(in)]) continue;
      if (!same_shape(g, gi->shape(), in->shape())) gi = b.sum_to(gi, in->shape());
      auto acc = grad.find(in);
      grad[in] = acc == grad.end() ? gi : b.add(acc->second, gi, "acc");
    }
  }

  std::vector<Node*> out;
  b.set_prefix("");
  for (Node* p : params) {
    auto it = grad.find(p);
    Node* gp;
    if (it == grad.end()) {
      gp = g.add(Op::full, {}, {{"shape", p->shape()}, {"value", 0.0}, {"dtype", std::string(dtype_name(p->dtype()))}},
                 "grad/" + p->name());
    } else {
      gp = it->second;
      // A gradient node shared with another parameter, or a forward value, gets its own copy.
      if (gp->role() != Role::none || g.position(gp) < n) gp = b.scale(gp, 1.0, "grad/" + p->name());
    }
    gp->set_role(Role::gradient);
    g.add_output(gp);
    out.push_back(gp);
  }
  eliminate_dead_code(g);
  return out;
}

size_t backward_begin(const Graph& g) {
  const std::vector<Node*> losses = g.with_role(Role::loss);
  if (losses.empty()) return g.size();
  const Node* seed = g.find("d." + losses[0]->name());
  return seed ? g.position(seed) : g.size();
}

PassResult passes::autograd(Graph& g, const PassContext&) {
  const std::vector<Node*> losses = g.with_role(Role::loss);
  if (losses.empty()) throw UsageError("autograd: the graph has no loss (a node with role loss)");
  build_backward(g, losses[0], g.with_role(Role::parameter));
  return {true};
}

}  // namespace autosp
