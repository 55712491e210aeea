// shard_label_ids: rank r keeps block r of the labels (already shifted by the data loader, so no
// target is lost at a shard boundary), and of the targets' pair slots where preference training
// has them (Role::pair_ids, the same positions); see shard_tensor.cpp.
#include "graph/passes/autosp/autosp.h"

namespace autosp::passes {

PassResult shard_label_ids(Graph& g, const PassContext& ctx) {
  PassResult res = shard_tagged_input(g, ctx, Role::labels);
  res.changed |= shard_tagged_input(g, ctx, Role::pair_ids).changed;
  return res;
}

}  // namespace autosp::passes
