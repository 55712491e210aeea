// keep_moe_projections (graph/passes/keep_moe_projections.h).
#include "graph/passes/keep_moe_projections.h"

#include <memory>

#include "graph/ops.h"

namespace autosp::passes {

PassResult keep_moe_projections(Graph& g, const PassContext& ctx) {
  PassResult r;
  if (!ctx.keep_moe_projections) return r;
  for (const std::unique_ptr<Node>& n : g.nodes()) {
    if (n->op() != Op::moe_experts || moe_keeps(*n)) continue;
    const DType dt = n->input(0)->dtype();
    if (dt != DType::f32 && dt != DType::f64) continue;
    n->attrs().set("keep", true);
    r.changed = true;
  }
  return r;
}

}  // namespace autosp::passes
