// normalize_loss: a token-mean loss  loss = cross_entropy_sum / count_valid(labels)  (or the tiled
// head's linear_cross_entropy_sum over the count)  becomes
//   loss = local_sum / all_reduce(local_count)          (the count is global, not differentiated)
// so that the gradients, summed over the world, are those of the global token mean; and
//   loss.global = all_reduce(loss)                        (the reported loss, a graph output)
// The DPO loss  loss = dpo_loss(sequence_logps(logits, labels, slots), ...)  (train.objective
// "dpo"; with runtime.tiled_loss the sums are the tiled head's DPO form, linear_cross_entropy_sum
// with the pair slots) needs each sequence's whole sum, whose targets sit on the P ranks of an SP
// group: it becomes
//   sequence_logps.global = all_reduce(sequence_logps, group sp)   (a graph output: the policy's sums)
//   loss = dpo_loss(sequence_logps.global, ...) with share 1/P
// Every rank of the group then computes the same loss; its 1/P share makes the world's sum of
// losses the loss once, and the all-reduce's vjp (an all-reduce of the P shares' gradients) gives
// each rank's partial sums the whole gradient. Its normalisers (the step's pairs) are fed.
// Any other loss is an error that names it. A no-op for a world of one.
#include "graph/passes/autosp/autosp.h"
#include "tensor/check.h"

namespace autosp::passes {

namespace {

void reduce_sequence_sums(Graph& g, const PassContext& ctx, Node* loss) {
  Node* sums = loss->input(0);
  const bool tiled = sums->op() == Op::linear_cross_entropy_sum && sums->inputs().size() == 4;
  if (sums->op() != Op::sequence_logps && !tiled)
    throw UsageError(str("normalize_loss: dpo_loss %", loss->name(), " reads %", sums->name(), " (", sums->op_name(),
                         "); expected sequence_logps or the tiled head's linear_cross_entropy_sum with pair slots"));
  if (ctx.sp_size == 1) return;
  Node* global = g.insert_after(sums, Op::all_reduce, {sums}, {{"group", std::string("sp")}}, sums->name() + ".global");
  g.replace_input(loss, 0, global);
  g.add_output(global);
  loss->attrs().set("share", 1.0 / static_cast<double>(ctx.sp_size));
}

}  // namespace

PassResult normalize_loss(Graph& g, const PassContext& ctx) {
  PassResult res;
  if (ctx.world_size == 1) return res;
  auto losses = g.with_role(Role::loss);
  if (losses.size() != 1) throw UsageError(str("normalize_loss: expected one node tagged loss, found ", losses.size()));
  Node* loss = losses[0];
  if (loss->op() == Op::dpo_loss) {
    reduce_sequence_sums(g, ctx, loss);
  } else {
    const bool mean = loss->op() == Op::div &&
                      (loss->input(0)->op() == Op::cross_entropy_sum ||
                       loss->input(0)->op() == Op::linear_cross_entropy_sum) &&
                      loss->input(1)->op() == Op::count_valid;
    if (!mean)
      throw UsageError(str("normalize_loss: cannot normalize loss %", loss->name(), " (", loss->op_name(),
                           "); expected div(cross_entropy_sum, count_valid), a token-mean loss, or dpo_loss"));
    Node* count = loss->input(1);
    Node* global_count =
        g.insert_after(count, Op::all_reduce, {count}, {{"group", std::string("world")}}, count->name() + ".global");
    g.replace_input(loss, 1, global_count);
  }
  Node* reported = g.insert_after(loss, Op::all_reduce, {loss}, {{"group", std::string("world")}}, loss->name() + ".global");
  g.add_output(reported);
  res.changed = true;
  return res;
}

}  // namespace autosp::passes
