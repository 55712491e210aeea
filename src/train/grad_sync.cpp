// Bucketed gradient all-reduce, blocking (all_reduce_bucketed) and overlapped with the backward
// (GradSync).
#include "train/grad_sync.h"

#include <cstring>

#include "device/cuda/device.h"

namespace autosp {
namespace {

// Gradients on a CUDA device are packed into buckets on that device, with copies enqueued on its
// compute stream (ordered after the kernel that produced the gradient, before the all-reduce that
// NCCL orders after the stream); host gradients with memcpy.
Allocator& allocator_of(Device d) {
  return d.kind == DeviceKind::cuda ? static_cast<Allocator&>(cuda_allocator(d.index)) : cpu_allocator();
}

// dst = src: same shape, dtype and device; src any strides, dst contiguous.
void copy_into(const Tensor& src, const Tensor& dst) {
  if (src.device().kind == DeviceKind::cuda) return copy_on_device(src, dst);
  const Tensor c = src.contiguous();
  std::memcpy(dst.raw(), c.raw(), c.nbytes());
}

// Buckets over items [0, n) of byte sizes `bytes(i)` and dtypes `dtype(i)`: consecutive items of one
// dtype, at most `cap` bytes each (at least one item). Returns the bucket boundaries.
template <class Bytes, class Dt>
std::vector<size_t> bucket_bounds(size_t n, Bytes&& bytes, Dt&& dtype, size_t cap) {
  std::vector<size_t> bounds{0};
  size_t i = 0;
  while (i < n) {
    size_t j = i, total = 0;
    while (j < n && dtype(j) == dtype(i) && (j == i || total + bytes(j) <= cap)) total += bytes(j++);
    bounds.push_back(j);
    i = j;
  }
  return bounds;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GradSyncStats all_reduce_bucketed(Communicator& comm, std::vector<Tensor>& grads, size_t bucket_bytes) {
  if (comm.size() == 1) return {};
  // The same buckets as the overlapped path, reduced with blocking calls once all are in.
  std::vector<GradSync::Slot> slots;
  for (const Tensor& g : grads) slots.push_back({g.shape(), g.dtype()});
  GradSync sync(comm, std::move(slots), /*overlap=*/false, bucket_bytes);
  for (size_t k = 0; k < grads.size(); ++k) sync.ready(k, grads[k]);
  const std::vector<Tensor> summed = sync.finish();
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!grads[k].is_contiguous())  // the reduced values come back into a contiguous tensor
      grads[k] = Tensor::empty(grads[k].shape(), grads[k].dtype(), allocator_of(grads[k].device()));
    copy_into(summed[k], grads[k]);
  }
  return sync.stats();
}

GradSync::GradSync(Communicator& comm, std::vector<Slot> slots, bool overlap, size_t bucket_bytes)
    : comm_(comm), slots_(std::move(slots)), overlap_(overlap) {
  auto nbytes = [&](size_t k) { return static_cast<size_t>(shape_numel(slots_[k].shape)) * dtype_size(slots_[k].dtype); };
  const auto bounds = bucket_bounds(slots_.size(), nbytes, [&](size_t k) { return slots_[k].dtype; }, bucket_bytes);
  bucket_of_.resize(slots_.size());
  offset_of_.resize(slots_.size());
  seen_.assign(slots_.size(), false);
  for (size_t b = 0; b + 1 < bounds.size(); ++b) {
    Bucket bucket;
    bucket.first = bounds[b];
    bucket.last = bounds[b + 1];
    size_t bytes = 0;
    for (size_t k = bucket.first; k < bucket.last; ++k) {
      bucket_of_[k] = b;
      offset_of_[k] = bytes;
      bytes += nbytes(k);
    }
    bucket.numel = static_cast<int64_t>(bytes / dtype_size(slots_[bucket.first].dtype));
    buckets_.push_back(std::move(bucket));
  }
}

GradSync::~GradSync() = default;  // a bucket still in flight is waited for by its PendingCollective

void GradSync::start(Bucket& b) {
  ++stats_.calls;
  stats_.bytes += b.flat.nbytes();
  if (comm_.size() == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  if (overlap_) b.pending = comm_.all_reduce_sum_async(b.flat);
  stats_.exposed_seconds += seconds_since(t0);
}

void GradSync::ready(size_t slot, const Tensor& grad) {
  AUTOSP_ASSERT(slot < slots_.size() && !seen_[slot], "gradient slot ", slot, " given twice or out of range");
  AUTOSP_ASSERT(grad.shape() == slots_[slot].shape && grad.dtype() == slots_[slot].dtype, "gradient slot ", slot,
                " is ", grad.str(), ", expected ", dtype_name(slots_[slot].dtype), shape_str(slots_[slot].shape));
  seen_[slot] = true;
  Bucket& b = buckets_[bucket_of_[slot]];
  if (!b.flat.defined() || b.flat.device() != grad.device())  // first use: on the gradients' device
    b.flat = Tensor::empty({b.numel}, grad.dtype(), allocator_of(grad.device()));
  copy_into(grad, Tensor::view_bytes(b.flat, offset_of_[slot], grad.shape(), grad.dtype()));
  if (++b.filled == b.last - b.first) start(b);
}

void GradSync::poll() {
  if (!overlap_ || comm_.size() == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  // Buckets finish in the order they started: test the oldest unfinished one only.
  while (next_poll_ < buckets_.size() && buckets_[next_poll_].pending && buckets_[next_poll_].pending->test()) {
    buckets_[next_poll_].pending.reset();
    ++next_poll_;
  }
  stats_.exposed_seconds += seconds_since(t0);
}

std::vector<Tensor> GradSync::finish() {
  for (size_t k = 0; k < slots_.size(); ++k) AUTOSP_ASSERT(seen_[k], "gradient slot ", k, " was never ready");
  const auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_) {
    if (b.pending) b.pending->wait();
    else if (!overlap_ && comm_.size() > 1) comm_.all_reduce_sum(b.flat);
    b.pending.reset();
    b.filled = 0;
  }
  stats_.wait_seconds += seconds_since(t0);
  stats_.exposed_seconds += seconds_since(t0);
  next_poll_ = 0;
  seen_.assign(slots_.size(), false);
  std::vector<Tensor> out;
  for (size_t k = 0; k < slots_.size(); ++k)
    out.push_back(Tensor::view_bytes(buckets_[bucket_of_[k]].flat, offset_of_[k], slots_[k].shape, slots_[k].dtype));
  return out;
}

}  // namespace autosp
