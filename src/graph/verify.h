// The verifier: checks a graph's structural invariants (order, use lists, unique names, arity,
// attributes, types equal to what the shape rules infer, outputs present). Passes run it after
// every rewrite. Throws UsageError describing the first violation.
#pragma once

#include <string>

#include "graph/ir.h"

namespace autosp {

enum class VerifyLevel {
  structure,  // order, use lists, names, arity, attributes, roles
  full,       // and every recorded type equals what its shape rule infers
};
void verify(const Graph& g, VerifyLevel level = VerifyLevel::full);

}  // namespace autosp
