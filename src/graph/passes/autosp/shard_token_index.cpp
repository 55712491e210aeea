// shard_token_index: rank r keeps block r of the token indices (the dropout mask's counter, LoRA's
// lora_dropout); their values are indices in the run's read order, so every layout drops what one
// process drops. See shard_tensor.cpp.
#include "graph/passes/autosp/autosp.h"

namespace autosp::passes {

PassResult shard_token_index(Graph& g, const PassContext& ctx) { return shard_tagged_input(g, ctx, Role::token_index); }

}  // namespace autosp::passes
