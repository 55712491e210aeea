// mixed_precision: f32 master weights cast to bf16 once each; activations bf16; loss path f32.
// Shapes do not change, only dtypes. Edits through the Graph API only.
#include "graph/passes/mixed_precision.h"

#include "tensor/check.h"

namespace autosp {
namespace passes {

PassResult mixed_precision(Graph& g, const PassContext&) {
  PassResult res;
  // LoRA's frozen base is never updated, so it needs no f32 master copy: it is fed in bf16 itself.
  for (Node* p : g.with_role(Role::frozen)) {
    if (p->dtype() != DType::f32)
      throw UsageError(str("mixed_precision: frozen parameter %", p->name(), " is ", p->type().str(), "; expected f32"));
    p->set_type({DType::bf16, p->shape()});
    res.changed = true;
  }
  for (Node* p : g.with_role(Role::parameter)) {
    if (p->dtype() != DType::f32)
      throw UsageError(str("mixed_precision: parameter %", p->name(), " is ", p->type().str(),
                           "; bf16 compute expects f32 master weights"));
    if (p->users().empty()) continue;
    Node* c = g.insert_after(p, Op::cast, {p}, {{"dtype", std::string(dtype_name(DType::bf16))}}, p->name() + ".bf16");
    g.replace_all_uses_with(p, c, c);
    res.changed = true;
  }
  for (const auto& n : g.nodes()) {
    if (n->op() == Op::full && n->dtype() == DType::f32) {
      n->attrs().set("dtype", std::string(dtype_name(DType::bf16)));
      res.changed = true;
    }
  }
  // Types in execution order, so each rule sees its inputs' new dtypes.
  for (const auto& n : g.nodes()) {
    if (n->op() == Op::input || n->op() == Op::parameter) continue;
    TensorType t = infer_type(*n, g.assumptions());
    if (!(t == n->type())) {
      n->set_type(std::move(t));
      res.changed = true;
    }
  }
  return res;
}

}  // namespace passes

}  // namespace autosp
