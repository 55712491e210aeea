// Bucketed gradient all-reduce.
#include "runtime/grad_sync.h"

#include <cstring>

namespace autosp {

GradSyncStats all_reduce_bucketed(Communicator& comm, std::vector<Tensor>& grads, size_t bucket_bytes) {
  GradSyncStats stats;
  if (comm.size() == 1) return stats;
  size_t i = 0;
  while (i < grads.size()) {
    // The bucket: grads[i, j) of one dtype, at most bucket_bytes (at least one tensor).
    const DType dt = grads[i].dtype();
    size_t j = i, bytes = 0;
    while (j < grads.size() && grads[j].dtype() == dt && (j == i || bytes + grads[j].nbytes() <= bucket_bytes))
      bytes += grads[j++].nbytes();
    const size_t es = dtype_size(dt);
    Tensor flat = Tensor::empty({static_cast<int64_t>(bytes / es)}, dt);
    char* p = static_cast<char*>(flat.raw());
    for (size_t k = i; k < j; ++k) {
      grads[k] = grads[k].contiguous();
      std::memcpy(p, grads[k].raw(), grads[k].nbytes());
      p += grads[k].nbytes();
    }
    comm.all_reduce_sum(flat);
    p = static_cast<char*>(flat.raw());
    for (size_t k = i; k < j; ++k) {
      std::memcpy(grads[k].raw(), p, grads[k].nbytes());
      p += grads[k].nbytes();
    }
    ++stats.calls;
    stats.bytes += bytes;
    i = j;
  }
  return stats;
}

}  // namespace autosp
