// feed_target_count (see feed_target_count.h): replace the token-mean loss's denominator by a
// scalar input, and erase the graph's own count. Any other loss is an error that names it.
#include "graph/passes/feed_target_count.h"

#include "graph/passes/loss_parts.h"

#include "tensor/check.h"

namespace autosp::passes {

namespace {

// The denominator of the token-mean loss: count_valid(labels), or all_reduce(count_valid(labels)).
bool is_target_count(const Node* n) {
  if (n->op() == Op::all_reduce) n = n->input(0);
  return n->op() == Op::count_valid;
}

// Erases `n` and then each of its inputs that nothing else uses (DCE keeps every collective, so it
// would keep the orphaned count's all-reduce).
void erase_chain(Graph& g, Node* n) {
  while (n && n->users().empty() && !g.is_output(n)) {
    Node* next = n->inputs().empty() ? nullptr : n->input(0);
    if (next && (next->op() == Op::input || next->op() == Op::parameter)) next = nullptr;
    g.erase(n);
    n = next;
  }
}

}  // namespace

PassResult feed_target_count(Graph& g, const PassContext& ctx) {
  auto losses = g.with_role(Role::loss);
  if (losses.size() != 1) throw UsageError(str("feed_target_count: expected one node tagged loss, found ", losses.size()));
  Node* loss = token_mean_of(losses[0]);
  if (loss->op() != Op::div || !is_target_count(loss->input(1)))
    throw UsageError(str("feed_target_count: cannot normalize loss %", loss->name(), " (", loss->op_name(),
                         ") over the step's micro-batches; expected div(cross_entropy_sum, count_valid), a "
                         "token-mean loss"));
  Node* count = loss->input(1);
  Node* fed = g.insert_before(g.nodes().front().get(), Op::input, {}, {}, kTargetCount, Role::none,
                              TensorType{count->dtype(), {}});
  g.replace_input(loss, 1, fed);
  erase_chain(g, count);
  // A load-balancing term (models/moe.h) is each micro-batch's own: its mean over the step's
  // micro-batches, as a DDP gradient averages them.
  if (Node* aux = aux_loss_of(losses[0]))
    aux->attrs().set("share", aux->attrs().f("share") / static_cast<double>(ctx.accumulation_steps));
  return {.changed = true};
}

}  // namespace autosp::passes
