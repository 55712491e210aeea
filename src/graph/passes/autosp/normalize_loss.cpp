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
// A mixture of experts' load-balancing loss  loss = add(lm_loss, scale(moe_aux_loss(stats)))
// (models/moe.h; lm_loss the token-mean loss above) becomes
//   moe_aux_loss(all_reduce(stats, group sp)) with share 1/world
//   router_stats.global = all_reduce(stats), aux_loss.global = all_reduce(aux_loss)   (outputs)
// so every rank of an SP group computes the loss of the group's sequences as one process would
// (counts and probability sums summed, then divided), the world's sum of the terms is their mean
// over the data-parallel groups, and the all-reduce's vjp gives each rank's probabilities the
// whole gradient (as for DPO's sums).
// Any other loss is an error that names it. A no-op for a world of one.
#include "graph/passes/autosp/autosp.h"
#include "graph/passes/loss_parts.h"
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

void reduce_router_stats(Graph& g, const PassContext& ctx, Node* aux) {
  Node* stats = aux->input(0);
  if (ctx.sp_size > 1) {
    Node* group = g.insert_after(stats, Op::all_reduce, {stats}, {{"group", std::string("sp")}}, stats->name() + ".sp");
    g.replace_input(aux, 0, group);
  }
  Node* world = g.insert_after(stats, Op::all_reduce, {stats}, {{"group", std::string("world")}}, stats->name() + ".global");
  g.add_output(world);
  aux->attrs().set("share", aux->attrs().f("share") / static_cast<double>(ctx.world_size));
  Node* reported = g.insert_after(aux, Op::all_reduce, {aux}, {{"group", std::string("world")}}, aux->name() + ".global");
  g.add_output(reported);
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
    Node* lm = token_mean_of(loss);
    const bool mean = lm->op() == Op::div &&
                      (lm->input(0)->op() == Op::cross_entropy_sum ||
                       lm->input(0)->op() == Op::linear_cross_entropy_sum) &&
                      lm->input(1)->op() == Op::count_valid;
    if (!mean)
      throw UsageError(str("normalize_loss: cannot normalize loss %", loss->name(), " (", loss->op_name(),
                           "); expected div(cross_entropy_sum, count_valid), a token-mean loss (plus a mixture of "
                           "experts' load-balancing term), or dpo_loss"));
    Node* count = lm->input(1);
    Node* global_count =
        g.insert_after(count, Op::all_reduce, {count}, {{"group", std::string("world")}}, count->name() + ".global");
    g.replace_input(lm, 1, global_count);
    if (Node* aux = aux_loss_of(loss)) reduce_router_stats(g, ctx, aux);
  }
  Node* reported = g.insert_after(loss, Op::all_reduce, {loss}, {{"group", std::string("world")}}, loss->name() + ".global");
  g.add_output(reported);
  res.changed = true;
  return res;
}

}  // namespace autosp::passes
