// prepare_autosp_inputs: find the inputs tagged input_ids and labels (position_ids, doc_start and
// token_index and pair_ids optional), check
// their sequence dim (dim 1) is the symbol S, and record the assumption S % P == 0 (S % 2P == 0
// with a ring: its 2R zigzag chunks; the runtime pads sequences to that multiple with ignored labels).
#include "graph/passes/autosp/autosp.h"
#include "tensor/check.h"

namespace autosp::passes {

PassResult prepare_autosp_inputs(Graph& g, const PassContext& ctx) {
  PassResult r;
  for (Role role : {Role::input_ids, Role::labels, Role::position_ids, Role::doc_start, Role::token_index,
                    Role::pair_ids}) {
    auto nodes = g.with_role(role);
    if (nodes.empty() && (role == Role::input_ids || role == Role::labels))
      throw UsageError(str("prepare_autosp_inputs: no input is tagged ", role_name(role)));
    for (Node* n : nodes) {
      if (n->op() != Op::input || n->type().rank() < 2)
        throw UsageError(str("prepare_autosp_inputs: %", n->name(), " tagged ", role_name(role), " must be an input [B, S, ...]"));
      const Dim& d = n->shape()[1];
      if (!d.is_symbol() || d.symbol_name() != ctx.seq)
        throw UsageError(str("prepare_autosp_inputs: %", n->name(), " has sequence dim ", d.str(), "; build the graph on the symbol ",
                             ctx.seq));
    }
  }
  if (ctx.sp_size > 1) {
    g.assume({Dim::sym(ctx.seq), ctx.ring_size == 1 ? ctx.sp_size : 2 * ctx.sp_size});
    r.changed = true;
  }
  return r;
}

}  // namespace autosp::passes
