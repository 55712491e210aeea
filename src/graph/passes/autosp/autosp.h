// AutoSP: the compiler passes that turn a single-sequence forward graph into the graph of one rank
// of a Ulysses sequence-parallel group (DESIGN.md "AutoSP semantics"). One pass per file:
//   rewrite_composite_attention   matmul → scale → [causal_mask] → softmax → matmul  ⇒  sdpa
//   prepare_autosp_inputs         find the tagged inputs, their symbolic sequence dim, assume S % P == 0
//   shard_seq_dim                 S → S//P in the attributes of every consumer; reject nodes that
//                                 reduce or contract over the sequence outside attention
//   shard_input_ids, shard_label_ids, shard_position_ids, shard_doc_start, shard_token_index
//                                 slice [r·(S//P), (r+1)·(S//P)) of each tagged input
//   normalize_loss                loss = local_sum / all_reduce(count); reported loss all-reduced
//   insert_attention_all_to_all   Ulysses all-to-alls around every sdpa (GQA: all-to-all'd or replicated K/V;
//                                 packed documents: one all-to-all gathers the full-S document starts)
//   propagate_shapes              recompute every type
//   insert_ring_attention         with a ring (ring_size R > 1): every sdpa becomes ring_attention
//                                 over the R ranks of this rank's ring group
//   canonicalize                  dead-code elimination and the full verifier
// With P = 1 and a world of several ranks (pure data parallel) only normalize_loss changes the graph.
//
// Ulysses × ring (ring_size R > 1, decision 99): the P ranks of an SP group are R ring ranks of
// U = P / R consecutive Ulysses ranks. The sequence is cut into 2R chunks and ring rank ρ holds
// chunks ρ and 2R-1-ρ (zigzag: equal causal work on every ring rank); Ulysses rank u of it holds
// the u-th of U equal blocks of those two chunks side by side. So rank r keeps S/P tokens in
// units of w = S//(2P): two units, possibly from two chunks (zigzag_units). Sequence dims are
// then spelled 2·w (S % 2P is assumed; the runtime pads to it), the Ulysses all-to-all gathers the
// ring rank's 2U·w tokens, and ring attention runs across the ring ranks.
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
PassResult shard_token_index(Graph&, const PassContext&);
PassResult normalize_loss(Graph&, const PassContext&);
PassResult insert_attention_all_to_all(Graph&, const PassContext&);
PassResult insert_ring_attention(Graph&, const PassContext&);
PassResult propagate_shapes(Graph&, const PassContext&);
PassResult canonicalize(Graph&, const PassContext&);

// Shared by the four shard_* input passes: slice every input with `role` to this rank's block.
PassResult shard_tagged_input(Graph& g, const PassContext& ctx, Role role);
}  // namespace passes

// The zigzag layout: the token ranges [a, b) of rank `sp_rank` of P = `sp_size` ranks with
// `ring_size` R > 1, in units of S/(2P), in the rank's local order (adjacent units merged).
std::vector<std::pair<int64_t, int64_t>> zigzag_units(int64_t sp_size, int64_t ring_size, int64_t sp_rank);
// The sequence length one rank holds, as the passes spell it: S//P, or 2·(S//(2P)) with a ring.
Dim rank_seq(const PassContext& ctx);
// The process group of the Ulysses all-to-alls: "sp" (Ulysses alone) or "ulysses" (with a ring).
std::string ulysses_group(const PassContext& ctx);

// The pipeline in its contractual order: run_pipeline(g, autosp_pipeline(), ctx) rewrites `g` for
// rank ctx.sp_rank of an SP group of ctx.sp_size in a world of ctx.world_size.
const std::vector<Pass>& autosp_pipeline();

}  // namespace autosp
