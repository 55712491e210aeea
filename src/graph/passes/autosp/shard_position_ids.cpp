// shard_position_ids: rank r keeps block r of the position ids (RoPE and learned positions see global positions); see shard_tensor.cpp.
#include "graph/passes/autosp/autosp.h"

namespace autosp::passes {

PassResult shard_position_ids(Graph& g, const PassContext& ctx) { return shard_tagged_input(g, ctx, Role::position_ids); }

}  // namespace autosp::passes
