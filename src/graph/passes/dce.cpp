// Dead-code elimination.
#include "graph/passes/dce.h"

namespace autosp {

size_t eliminate_dead_code(Graph& g) {
  // A reverse sweep: a node's users come after it, so by the time it is reached every user that
  // was dead is gone. Over a snapshot, since erasing in the middle reorders the graph lazily.
  std::vector<Node*> order;
  order.reserve(g.size());
  for (const auto& n : g.nodes()) order.push_back(n.get());
  size_t erased = 0;
  for (size_t i = order.size(); i-- > 0;) {
    Node* n = order[i];
    if (!n->users().empty() || g.is_output(n) || n->op() == Op::input || n->op() == Op::parameter) continue;
    if (op_info(n->op()).collective) continue;  // every rank of its group takes part
    g.erase(n);
    ++erased;
  }
  return erased;
}

}  // namespace autosp
