// normalize_loss: a token-mean loss  loss = cross_entropy_sum / count_valid(labels)  (or the tiled
// head's linear_cross_entropy_sum over the count)  becomes
//   loss = local_sum / all_reduce(local_count)          (the count is global, not differentiated)
// so that the gradients, summed over the world, are those of the global token mean; and
//   loss.global = all_reduce(loss)                        (the reported loss, a graph output)
// Any other loss is an error that names it. A no-op for a world of one.
#include "graph/passes/autosp/autosp.h"
#include "tensor/check.h"

namespace autosp::passes {

PassResult normalize_loss(Graph& g, const PassContext& ctx) {
  PassResult res;
  if (ctx.world_size == 1) return res;
  auto losses = g.with_role(Role::loss);
  if (losses.size() != 1) throw UsageError(str("normalize_loss: expected one node tagged loss, found ", losses.size()));
  Node* loss = losses[0];
  const bool mean = loss->op() == Op::div &&
                    (loss->input(0)->op() == Op::cross_entropy_sum ||
                     loss->input(0)->op() == Op::linear_cross_entropy_sum) &&
                    loss->input(1)->op() == Op::count_valid;
  if (!mean)
    throw UsageError(str("normalize_loss: cannot normalize loss %", loss->name(), " (", loss->op_name(),
                         "); expected div(cross_entropy_sum, count_valid), a token-mean loss"));
  Node* count = loss->input(1);
  Node* global_count = g.insert_after(count, Op::all_reduce, {count}, {{"group", std::string("world")}}, count->name() + ".global");
  g.replace_input(loss, 1, global_count);
  Node* reported = g.insert_after(loss, Op::all_reduce, {loss}, {{"group", std::string("world")}}, loss->name() + ".global");
  g.add_output(reported);
  res.changed = true;
  return res;
}

}  // namespace autosp::passes
