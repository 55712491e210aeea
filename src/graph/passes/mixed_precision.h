// bf16 mixed precision as a graph pass (runtime.dtype "bfloat16"): the semantics of PyTorch
// autocast / AMP and llm.c — f32 master weights, bf16 weights and activations in compute, f32
// accumulation inside kernels, and the loss, its normaliser and the parameter gradients in f32.
#pragma once

#include "graph/passes/pass.h"

namespace autosp {

namespace passes {
// An f32 forward graph → bf16 compute. Each parameter stays f32 and gets one cast to bf16 that all
// its users read (a frozen one, LoRA's base, becomes a bf16 parameter itself: no master copy); f32 `full` constants become bf16; then every type is recomputed from the op
// table, whose rules keep the loss path in f32 (cross_entropy_sum of bf16 logits is f32, the
// count_valid normaliser keeps its f32 dtype, the division is f32, sdpa's log-sum-exp is f32).
// Run before AutoSP and autograd (docs/decisions.md): the backward then gets, through the cast's
// vjp, each parameter's gradient cast back to f32.
PassResult mixed_precision(Graph&, const PassContext&);
}  // namespace passes

}  // namespace autosp
