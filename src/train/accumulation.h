// Gradient accumulation (train.gradient_accumulation_steps = k): a step's batch of k·micro
// sequences per dp rank, read exactly as one step of batch k·micro would read it, runs as k
// micro-batches of data.batch_size sequences. The loss is normalised by the step's global count of
// scored targets (over the k micro-batches and every dp group), counted on the host before the
// first backward and fed to the graph (graph/passes/feed_target_count.h), so the step's loss and
// gradients are those of one step over the whole batch, not a mean of micro-batch means (Hugging
// Face's rule since its accumulation fix). This rank sums the micro-batches' gradients in one
// accumulator (GradAccumulator) and the training state synchronises only the last micro-batch's,
// with the sum added in, overlapped with its backward (train/train_state.h).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"
#include "comm/mesh.h"
#include "graph/ir.h"
#include "tensor/tensor.h"
#include "train/data.h"

namespace autosp {

// Micro-batch i of k: rows [i·B/k, (i+1)·B/k) of every tensor of `b` (B rows, k divides B).
Batch micro_batch(const Batch& b, int64_t i, int64_t k);

// The step's scored targets (labels ≠ -100) over the world: this rank's batch counted once per SP
// group (its ranks read the same sequences). Every rank calls it together (one integer all-reduce
// over `host`).
int64_t global_target_count(const Batch& b, const ProcessMesh& mesh, Communicator& host);

// Sums a step's k micro-batch gradients on this rank, each gradient node in its own buffer on the
// gradient's device, kept from step to step: micro-batch 0's are copied in, the next ones added,
// and the last one's gradient becomes the sum (written into it in place, before the training
// state sees it), adding in micro-batch order. With k = 1 it does nothing.
class GradAccumulator {
 public:
  void take(const Node& n, const Tensor& grad, int64_t micro, int64_t k);
  size_t bytes() const;  // the buffers held

 private:
  std::unordered_map<const Node*, Tensor> sums_;
};

}  // namespace autosp
