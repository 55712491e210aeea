// shard_doc_start: rank r keeps block r of the document starts (packed documents); their values are
// positions in the full sequence, so a block keeps them as they are. insert_attention_all_to_all
// gathers the full [B, S] back for the attention. See shard_tensor.cpp.
#include "graph/passes/autosp/autosp.h"

namespace autosp::passes {

PassResult shard_doc_start(Graph& g, const PassContext& ctx) { return shard_tagged_input(g, ctx, Role::doc_start); }

}  // namespace autosp::passes
