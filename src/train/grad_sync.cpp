// Bucketed gradient all-reduce (or ZeRO's reduce-scatter), blocking (all_reduce_bucketed) and
// overlapped with the backward (GradSync).
#include "train/grad_sync.h"

#include <cstring>

#include "device/buffers.h"
#include "device/cuda/device.h"

namespace autosp {
namespace {

// Gradients on a CUDA device are packed into buckets on that device, with copies enqueued on its
// compute stream (ordered after the kernel that produced the gradient, before the all-reduce that
// NCCL orders after the stream); host gradients with memcpy.
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
  std::vector<GradSlot> slots;
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

FlatLayout flat_layout(std::vector<GradSlot> slots, size_t bucket_bytes, int ranks) {
  AUTOSP_ASSERT(ranks >= 1, "flat layout over ", ranks, " ranks");
  FlatLayout l;
  l.ranks = ranks;
  l.slots = std::move(slots);
  auto numel = [&](size_t k) { return shape_numel(l.slots[k].shape); };
  auto nbytes = [&](size_t k) { return static_cast<size_t>(numel(k)) * dtype_size(l.slots[k].dtype); };
  const auto bounds = bucket_bounds(l.slots.size(), nbytes, [&](size_t k) { return l.slots[k].dtype; }, bucket_bytes);
  l.bucket_of.resize(l.slots.size());
  l.offset_of.resize(l.slots.size());
  for (size_t b = 0; b + 1 < bounds.size(); ++b) {
    FlatLayout::Bucket bucket;
    bucket.first = bounds[b];
    bucket.last = bounds[b + 1];
    bucket.dtype = l.slots[bucket.first].dtype;
    for (size_t k = bucket.first; k < bucket.last; ++k) {
      l.bucket_of[k] = b;
      l.offset_of[k] = bucket.numel;
      bucket.numel += numel(k);
    }
    bucket.padded = (bucket.numel + ranks - 1) / ranks * ranks;
    l.buckets.push_back(bucket);
  }
  return l;
}

GradSync::GradSync(Communicator& comm, std::vector<Slot> slots, bool overlap, size_t bucket_bytes, ZeroMode mode)
    : comm_(comm),
      layout_(flat_layout(std::move(slots), bucket_bytes,
                          mode == ZeroMode::replicated ? 1 : comm.size())),
      overlap_(overlap),
      shard_(mode != ZeroMode::replicated),
      free_buckets_(mode == ZeroMode::sharded_gradients),
      buckets_(layout_.buckets.size()) {
  AUTOSP_ASSERT(mode != ZeroMode::sharded_parameters, "GradSync at ZeRO-3 (the graph synchronises its gradients)");
  seen_.assign(layout_.slots.size(), false);
}

GradSync::~GradSync() = default;  // a bucket still in flight is waited for by its PendingCollective

// The bucket's buffers on `device`, its padding zero (the reduce-scatter sums it with the rest).
void GradSync::allocate(size_t b, Device device) {
  const FlatLayout::Bucket& l = layout_.buckets[b];
  Bucket& bucket = buckets_[b];
  Allocator& alloc = allocator_of(device);
  bucket.flat = Tensor::empty({l.padded}, l.dtype, alloc);
  if (l.padded > l.numel) {
    const Tensor pad = Tensor::view_bytes(bucket.flat, static_cast<size_t>(l.numel) * dtype_size(l.dtype),
                                          {l.padded - l.numel}, l.dtype);
    const Tensor zeros = Tensor::zeros({l.padded - l.numel}, l.dtype);
    copy_into(device.kind == DeviceKind::cpu ? zeros : to_device(zeros, device), pad);
  }
  if (shard_ && (!bucket.shard.defined() || bucket.shard.device() != device))
    bucket.shard = Tensor::empty({layout_.shard_numel(b)}, l.dtype, alloc);
}

void GradSync::start(size_t b) {
  Bucket& bucket = buckets_[b];
  ++stats_.calls;
  stats_.bytes += bucket.flat.nbytes();
  if (comm_.size() == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  if (overlap_)
    bucket.pending = shard_ ? comm_.reduce_scatter_sum_async(bucket.flat, bucket.shard)
                                     : comm_.all_reduce_sum_async(bucket.flat);
  stats_.exposed_seconds += seconds_since(t0);
}

void GradSync::done(size_t b) {
  buckets_[b].pending.reset();
  if (free_buckets_) buckets_[b].flat = Tensor{};  // ZeRO-2: only the shard outlives the reduce-scatter
}

void GradSync::ready(size_t slot, const Tensor& grad) {
  const std::vector<GradSlot>& slots = layout_.slots;
  AUTOSP_ASSERT(slot < slots.size() && !seen_[slot], "gradient slot ", slot, " given twice or out of range");
  AUTOSP_ASSERT(grad.shape() == slots[slot].shape && grad.dtype() == slots[slot].dtype, "gradient slot ", slot,
                " is ", grad.str(), ", expected ", dtype_name(slots[slot].dtype), shape_str(slots[slot].shape));
  seen_[slot] = true;
  const size_t b = layout_.bucket_of[slot];
  Bucket& bucket = buckets_[b];
  if (!bucket.flat.defined() || bucket.flat.device() != grad.device()) allocate(b, grad.device());
  copy_into(grad, Tensor::view_bytes(bucket.flat, static_cast<size_t>(layout_.offset_of[slot]) * dtype_size(grad.dtype()),
                                     grad.shape(), grad.dtype()));
  if (++bucket.filled == layout_.buckets[b].last - layout_.buckets[b].first) start(b);
}

void GradSync::poll() {
  if (!overlap_ || comm_.size() == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  // Buckets finish in the order they started: test the oldest unfinished one only.
  while (next_poll_ < buckets_.size() && buckets_[next_poll_].pending && buckets_[next_poll_].pending->test()) {
    done(next_poll_);
    ++next_poll_;
  }
  stats_.exposed_seconds += seconds_since(t0);
}

void GradSync::wait_all() {
  for (size_t k = 0; k < layout_.slots.size(); ++k) AUTOSP_ASSERT(seen_[k], "gradient slot ", k, " was never ready");
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.pending) bucket.pending->wait();
    else if (!overlap_ && comm_.size() > 1 && shard_) comm_.reduce_scatter_sum(bucket.flat, bucket.shard);
    else if (!overlap_ && comm_.size() > 1) comm_.all_reduce_sum(bucket.flat);
    else if (shard_ && comm_.size() == 1 && bucket.flat.defined()) copy_into(bucket.flat, bucket.shard);
    if (bucket.flat.defined()) done(b);
    bucket.filled = 0;
  }
  stats_.wait_seconds += seconds_since(t0);
  stats_.exposed_seconds += seconds_since(t0);
  next_poll_ = 0;
  seen_.assign(layout_.slots.size(), false);
}

std::vector<Tensor> GradSync::finish() {
  AUTOSP_ASSERT(!shard_, "GradSync::finish with ZeRO sharding (finish_shards)");
  wait_all();
  std::vector<Tensor> out;
  for (size_t k = 0; k < layout_.slots.size(); ++k) {
    const GradSlot& s = layout_.slots[k];
    out.push_back(Tensor::view_bytes(buckets_[layout_.bucket_of[k]].flat,
                                     static_cast<size_t>(layout_.offset_of[k]) * dtype_size(s.dtype), s.shape, s.dtype));
  }
  return out;
}

std::vector<Tensor> GradSync::finish_shards() {
  AUTOSP_ASSERT(shard_, "GradSync::finish_shards without ZeRO");
  wait_all();
  std::vector<Tensor> out;
  for (const Bucket& b : buckets_) out.push_back(b.shard);
  return out;
}

size_t GradSync::bucket_bytes_held() const {
  size_t n = 0;
  for (const Bucket& b : buckets_) n += b.flat.defined() ? b.flat.nbytes() : 0;
  return n;
}

}  // namespace autosp
