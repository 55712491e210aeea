// keep_moe_projections: a mixture-of-experts layer keeps each assignment's gate and up projections
// for its backward (runtime.moe_keep_projections, on by default on the CPU; decision 253). Marks
// every moe_experts node of f32 or f64 with the attribute "keep": the node then has the extra
// output [2, rows · top_k, I] (graph/ops.h moe_keeps) and its vjp hands that block to
// moe_experts_backward, which starts from it instead of computing the two projections again
// (kernels/cpu/moe.h moe_experts_forward_keeping, moe_experts_backward_from_kept). What PyTorch's
// autograd does by default; the block is planned memory from the forward to the backward.
// Training programs only (Stage::joint, before autograd): a forward-only program never keeps. Not
// the expert-parallel op (its exchange recomputes), not bf16 (kernels/cpu/moe_bf16.h recomputes),
// not CUDA (the program builder sets the context's flag for CPU runs only).
#pragma once

#include "graph/passes/pass.h"

namespace autosp::passes {

PassResult keep_moe_projections(Graph& g, const PassContext& ctx);

}  // namespace autosp::passes
