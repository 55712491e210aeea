// shard_input_ids: rank r keeps block r of the token ids; see shard_tensor.cpp.
#include "graph/passes/autosp/autosp.h"

namespace autosp::passes {

PassResult shard_input_ids(Graph& g, const PassContext& ctx) { return shard_tagged_input(g, ctx, Role::input_ids); }

}  // namespace autosp::passes
