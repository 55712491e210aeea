// propagate_shapes: recompute every node's type from its inputs with the op's shape rule, under the
// graph's assumptions (so (S//P)·P reads S).
#include "graph/passes/autosp/autosp.h"

namespace autosp::passes {

PassResult propagate_shapes(Graph& g, const PassContext&) {
  PassResult res;
  for (const auto& n : g.nodes()) {
    if (n->op() == Op::input || n->op() == Op::parameter) continue;
    TensorType t = infer_type(*n, g.assumptions());
    for (auto& d : t.shape) d = simplify(d, g.assumptions());
    if (!(t == n->type())) {
      n->set_type(t);
      res.changed = true;
    }
  }
  return res;
}

}  // namespace autosp::passes
