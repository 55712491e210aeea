// The verifier: checks a graph's structural invariants (order, use lists, unique names, arity,
// attributes, types equal to what the shape rules infer, outputs present). Passes run it after
// every rewrite. Throws UsageError describing the first violation. The type check is incremental:
// it infers again only the nodes an edit may have changed since the last full verify (ir.h:
// Node::type_checked), so verifying after each of the ~20 passes costs about the edits, not the
// graph (decision 106).
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
