// Autograd: appends the backward graph to a forward graph. Each node's vjp rule (graph/vjp.cpp)
// builds IR for its inputs' gradients; gradients of a value used several times are summed, and a
// gradient whose shape is a broadcast of its input's is summed back with `sum_to` here, in one
// place. The backward is ordinary IR: the verifier, printer, passes and executor treat it like the
// forward. Knows nothing of kernels.
#pragma once

#include <map>
#include <vector>

#include "graph/builder.h"
#include "graph/passes/pass.h"

namespace autosp {

struct VjpContext {
  Builder& b;
  Node* node;  // the forward node
  Node* grad;  // gradient of the loss with respect to node's output (null only for ops with
               // differentiable extras whose primary output does not reach the loss)
  std::vector<Node*> output_grads;  // [i]: gradient of extra output i (1, 2, ...) or null; index 0 unused
  std::vector<Node*> input_grads;  // set by the rule; nullptr = no gradient for that input
  std::vector<bool> needs_grad;    // [i]: input i depends on a parameter (a frozen one does not)

  Node* in(size_t i) const { return node->input(i); }
  const SymShape& in_shape(size_t i) const { return node->input(i)->shape(); }
};

// Appends dloss/dparam for every node in `params` (seeded with dloss = 1) and returns them in the same
// order. Each gradient is a graph output named "grad/<param>" with Role::gradient. A parameter the
// loss does not depend on gets a zero gradient. Throws UsageError if the loss depends on a params
// through a non-differentiable op.
std::vector<Node*> build_backward(Graph& g, Node* loss, const std::vector<Node*>& params);

// The position where the backward starts: its first node, the seed gradient "d.<loss>" that
// build_backward appends first; g.size() for a graph without a backward.
size_t backward_begin(const Graph& g);

namespace passes {
// Autograd as a pass: the backward of the graph's loss (its Role::loss node) for every parameter.
PassResult autograd(Graph& g, const PassContext& ctx);
}  // namespace passes

}  // namespace autosp
