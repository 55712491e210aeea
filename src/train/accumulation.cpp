// Gradient accumulation's pieces (train/accumulation.h): micro-batch views, the global target
// count, and the per-rank gradient sum.
#include "train/accumulation.h"

#include "device/buffers.h"
#include "graph/ops.h"  // kIgnoreIndex
#include "tensor/check.h"

namespace autosp {

namespace {

// Rows [i·B/k, (i+1)·B/k) of a contiguous [B, S] tensor, as a view (no copy); undefined stays so.
Tensor rows(const Tensor& t, int64_t i, int64_t k) {
  if (!t.defined()) return t;
  const int64_t B = t.dim(0), S = t.dim(1), rows = B / k;
  return t.as_strided({rows, S}, {S, 1}, i * rows * S);
}

}  // namespace

Batch micro_batch(const Batch& b, int64_t i, int64_t k) {
  const int64_t B = b.input_ids.dim(0);
  AUTOSP_ASSERT(k >= 1 && i >= 0 && i < k && B % k == 0 && b.input_ids.is_contiguous(), "micro-batch ", i, " of ", k,
                " of a batch of ", B);
  if (k == 1) return b;
  return {rows(b.input_ids, i, k), rows(b.labels, i, k), rows(b.position_ids, i, k), rows(b.doc_start, i, k),
          rows(b.token_index, i, k), rows(b.pair_ids, i, k)};
}

int64_t global_target_count(const Batch& b, const ProcessMesh& mesh, Communicator& host) {
  int64_t scored = 0;
  if (mesh.sp_rank == 0) {
    const int64_t* labels = b.labels.data<int64_t>();
    for (int64_t i = 0; i < b.labels.numel(); ++i) scored += labels[i] != kIgnoreIndex;
  }
  Tensor total = Tensor::from_vector<int64_t>({1}, {scored});
  host.all_reduce_sum(total);
  return total.data<int64_t>()[0];
}

void GradAccumulator::take(const Node& n, const Tensor& grad, int64_t micro, int64_t k) {
  if (k == 1) return;
  AUTOSP_ASSERT(grad.is_contiguous(), "gradient ", n.name(), " is not contiguous");
  Tensor& sum = sums_[&n];
  if (!sum.defined()) sum = empty_on(grad.numel(), grad.dtype(), grad.device());
  if (micro == 0) {
    copy_bytes(sum.raw(), grad.raw(), grad.nbytes(), grad.device());
    return;
  }
  void* dst = micro == k - 1 ? grad.raw() : sum.raw();  // the last: the gradient becomes the sum
  sum_parts({sum.raw(), grad.raw()}, dst, grad.numel(), grad.dtype(), grad.device());
}

size_t GradAccumulator::bytes() const {
  size_t total = 0;
  for (const auto& [node, sum] : sums_) total += sum.nbytes();
  return total;
}

}  // namespace autosp
