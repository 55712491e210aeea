// The shared step of shard_input_ids, shard_label_ids and shard_position_ids (the seed's
// shard_tensor_node): after each input with the role, insert
//   %x.r = slice(%x, dim=1, start=r·(S//P), end=(r+1)·(S//P))
// and make every consumer read the slice: rank r keeps the contiguous block r of the sequence.
#include "graph/passes/autosp/autosp.h"

namespace autosp::passes {

PassResult shard_tagged_input(Graph& g, const PassContext& ctx, Role role) {
  PassResult res;
  if (ctx.sp_size == 1) return res;
  const Dim block = Dim::sym(ctx.seq).floordiv(ctx.sp_size);
  for (Node* x : g.with_role(role)) {
    Node* s = g.insert_after(x, Op::slice, {x},
                             {{"dim", int64_t{1}}, {"start", Dim(ctx.sp_rank) * block}, {"end", Dim(ctx.sp_rank + 1) * block}},
                             x->name() + ".r");
    g.replace_all_uses_with(x, s, s);
    res.changed = true;
  }
  return res;
}

}  // namespace autosp::passes
