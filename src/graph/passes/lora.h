// LoRA as a graph rewrite (PEFT's LoraLayer, docs/decisions.md 113): every projection the plan
// targets, y = x · W (+ b), becomes y = x · W (+ b) + (scale · (x · Aᵀ)) · Bᵀ (scaled on the r
// columns, the narrow side), with A [r, in] and
// B [out, r] new parameters (the plan names them: models/lora.h), and every other parameter
// frozen (Role::frozen: fed, never differentiated, no optimizer state) unless the plan lists it as
// trainable. It runs first, on the model's forward graph, so every later pass (mixed precision,
// AutoSP, ZeRO-3's sharding, fusion, autograd, checkpointing) sees ordinary matmuls and
// parameters. Knows nothing of configs or of how targets are chosen.
#pragma once

#include "graph/passes/pass.h"

namespace autosp {
namespace passes {
// The rewrite above; nothing when ctx.lora.r is 0. A target's matmuls are those whose right operand
// is its weight parameter; the adapter reads the same x, so a sharded sequence, a bf16 cast or a
// ZeRO-3 gather reach it as they reach W. With plan.dropout > 0 the adapter reads
// dropout(x) instead (Op::dropout, one seed per target), masked by a new token_index input
// (Role::token_index, [B, S] like input_ids) that AutoSP slices like position_ids. A target weight the graph lacks, or one no matmul reads
// (the tiled MLP's fused op hides its projections), is an error naming it.
PassResult lora(Graph&, const PassContext&);
}  // namespace passes
}  // namespace autosp
