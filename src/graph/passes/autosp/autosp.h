// AutoSP: the compiler passes that turn a single-sequence forward graph into the graph of one rank
// of a Ulysses sequence-parallel group (DESIGN.md "AutoSP semantics"). One pass per file:
//   rewrite_composite_attention   matmul → scale → [causal_mask] → softmax → matmul  ⇒  sdpa
//   prepare_autosp_inputs         find the tagged inputs, their symbolic sequence dim, assume S % P == 0
//   shard_seq_dim                 S → S//P in the attributes of every consumer; reject nodes that
//                                 reduce or contract over the sequence outside attention
//   shard_input_ids, shard_label_ids, shard_position_ids, shard_doc_start
//                                 slice [r·(S//P), (r+1)·(S//P)) of each tagged input
//   normalize_loss                loss = local_sum / all_reduce(count); reported loss all-reduced
//   insert_attention_all_to_all   Ulysses all-to-alls around every sdpa (GQA: all-to-all'd or replicated K/V;
//                                 packed documents: one all-to-all gathers the full-S document starts)
//   propagate_shapes              recompute every type
//   canonicalize                  dead-code elimination and the full verifier
// With P = 1 and a world of several ranks (pure data parallel) only normalize_loss changes the graph.
#pragma once

#include <vector>

#include "graph/passes/pass.h"

namespace autosp {

namespace passes {
PassResult rewrite_composite_attention(Graph&, const PassContext&);
PassResult prepare_autosp_inputs(Graph&, const PassContext&);
PassResult shard_seq_dim(Graph&, const PassContext&);
PassResult shard_input_ids(Graph&, const PassContext&);
PassResult shard_label_ids(Graph&, const PassContext&);
PassResult shard_position_ids(Graph&, const PassContext&);
PassResult shard_doc_start(Graph&, const PassContext&);
PassResult normalize_loss(Graph&, const PassContext&);
PassResult insert_attention_all_to_all(Graph&, const PassContext&);
PassResult propagate_shapes(Graph&, const PassContext&);
PassResult canonicalize(Graph&, const PassContext&);

// Shared by the four shard_* input passes: slice every input with `role` to this rank's block.
PassResult shard_tagged_input(Graph& g, const PassContext& ctx, Role role);
}  // namespace passes

// The pipeline in its contractual order: run_pipeline(g, autosp_pipeline(), ctx) rewrites `g` for
// rank ctx.sp_rank of an SP group of ctx.sp_size in a world of ctx.world_size.
const std::vector<Pass>& autosp_pipeline();

}  // namespace autosp
