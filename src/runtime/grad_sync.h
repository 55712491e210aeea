// Gradient synchronisation: sum gradients over a group in a few large all-reduces. Consecutive
// gradients of one dtype are packed into buckets of about `bucket_bytes`, each bucket is reduced
// with one call, then unpacked (DDP-style bucketing; one call per tensor would be latency-bound).
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "tensor/tensor.h"

namespace autosp {

struct GradSyncStats {
  size_t calls = 0, bytes = 0;
};

GradSyncStats all_reduce_bucketed(Communicator& comm, std::vector<Tensor>& grads, size_t bucket_bytes = 32u << 20);

}  // namespace autosp
