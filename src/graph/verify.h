// The verifier: checks a graph's structural invariants (order, use lists, unique names, arity,
// attributes, types equal to what the shape rules infer, outputs present). Passes run it after
// every rewrite. Throws UsageError describing the first violation.
#pragma once

#include <string>

#include "graph/ir.h"

namespace autosp {

void verify(const Graph& g);

}  // namespace autosp
