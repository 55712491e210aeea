// Dead-code elimination: a reverse sweep that erases every node nobody uses, except graph outputs,
// leaves (inputs and parameters are the graph's interface) and collectives (the op table's
// `collective` column: their effect is on the other ranks of the group).
#pragma once

#include "graph/ir.h"

namespace autosp {

// Returns the number of nodes erased.
size_t eliminate_dead_code(Graph& g);

}  // namespace autosp
