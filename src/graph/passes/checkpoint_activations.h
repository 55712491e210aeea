// Activation checkpointing: in a joint forward+backward graph, the forward of each scope (a
// transformer layer: the nodes whose names start with a given prefix) is recomputed inside the
// backward, right before the first backward node that reads one of its values. Backward nodes
// then read the recomputed values, so the forward's own intermediates die at the end of the
// forward and only the scope's inputs (the residual stream, parameters, positions) stay alive.
// Trades one extra forward per layer for memory; the gradients are unchanged.
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"

namespace autosp {

// `forward_end`: the number of forward nodes (the backward starts there). Returns how many nodes
// were recomputed.
size_t checkpoint_activations(Graph& g, size_t forward_end, const std::vector<std::string>& scopes);

}  // namespace autosp
