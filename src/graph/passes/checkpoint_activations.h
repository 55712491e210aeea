// Activation checkpointing: in a joint forward+backward graph, the forward of each scope (a
// transformer layer: the nodes whose names start with a given prefix) is recomputed inside the
// backward, right before the first backward node that reads one of its values. Backward nodes
// then read the recomputed values, so the forward's own intermediates die at the end of the
// forward and only the scope's inputs (the residual stream, parameters, positions) stay alive.
// Trades one extra forward per layer for memory; the gradients are unchanged.
#pragma once

#include <string>
#include <vector>

#include "graph/passes/pass.h"

namespace autosp::passes {

// Scopes: ctx.layer_scopes. The backward starts at the seed gradient autograd appended
// (graph/autograd.h: backward_begin); a graph without one is left as it is.
PassResult checkpoint_activations(Graph& g, const PassContext& ctx);

}  // namespace autosp::passes
