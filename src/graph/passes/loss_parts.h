// The parts of a training graph's loss node (Role::loss) that the loss passes rewrite
// (autosp/normalize_loss, feed_target_count): the token-mean loss div(cross_entropy_sum,
// count_valid) itself, or, with a mixture of experts' load-balancing loss (models/moe.h),
//   loss = add(lm_loss, scale(moe_aux_loss(stats)))
// whose first input is the token-mean part. Knows nothing of models.
#pragma once

#include "graph/ir.h"

namespace autosp::passes {

// The load-balancing loss node of `loss` (an moe_aux_loss), or nullptr.
inline Node* aux_loss_of(Node* loss) {
  if (loss->op() != Op::add || loss->input(1)->op() != Op::scale) return nullptr;
  Node* aux = loss->input(1)->input(0);
  return aux->op() == Op::moe_aux_loss ? aux : nullptr;
}

// The token-mean part of `loss`: its first input when it carries a load-balancing term, else itself.
inline Node* token_mean_of(Node* loss) { return aux_loss_of(loss) ? loss->input(0) : loss; }

}  // namespace autosp::passes
