// Dead-code elimination.
#include "graph/passes/dce.h"

namespace autosp {

size_t eliminate_dead_code(Graph& g) {
  size_t erased = 0;
  for (size_t i = g.size(); i-- > 0;) {
    Node* n = g.nodes()[i].get();
    if (!n->users().empty() || g.is_output(n) || n->op() == Op::input || n->op() == Op::parameter) continue;
    if (op_info(n->op()).side_effects) continue;
    g.erase(n);
    ++erased;
  }
  return erased;
}

}  // namespace autosp
