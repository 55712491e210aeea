// shard_label_ids: rank r keeps block r of the labels (already shifted by the data loader, so no target is lost at a shard boundary); see shard_tensor.cpp.
#include "graph/passes/autosp/autosp.h"

namespace autosp::passes {

PassResult shard_label_ids(Graph& g, const PassContext& ctx) { return shard_tagged_input(g, ctx, Role::labels); }

}  // namespace autosp::passes
