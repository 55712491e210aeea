// feed_target_count: the loss normaliser of gradient accumulation (train.gradient_accumulation_steps
// k > 1). The token-mean loss divides this rank's summed cross entropy by the number of scored
// targets, which the graph counts itself: count_valid(labels), or after normalize_loss that count
// all-reduced over the world. One micro-batch of k must not be normalised by its own count: the
// step's loss is the token mean over all k micro-batches of every rank (Hugging Face's accumulation
// rule, not a mean of micro-batch means). So the denominator becomes a scalar graph input,
//   loss = Σ local cross entropy / target_count        target_count: f32 or f64 [], fed
// which the trainer counts on the host before the step's first backward (train/trainer.cpp), and
// the graph's own count (and its all-reduce) go. The reported loss (normalize_loss's loss.global)
// is then this micro-batch's share of the step's loss; the k shares add up to it. Runs before
// autograd, which treats the input like count_valid: nothing flows back to it.
#pragma once

#include "graph/passes/pass.h"

namespace autosp::passes {

inline constexpr const char* kTargetCount = "target_count";  // the input's name, the trainer's feed

PassResult feed_target_count(Graph& g, const PassContext& ctx);

}  // namespace autosp::passes
