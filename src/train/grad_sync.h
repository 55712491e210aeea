// Gradient synchronisation: sum gradients over a group in a few large all-reduces. Consecutive
// gradients of one dtype are packed into buckets of about `bucket_bytes`, each bucket is reduced
// with one call (DDP-style bucketing; one call per tensor would be latency-bound).
//
// all_reduce_bucketed reduces a finished list with blocking calls. GradSync overlaps the reduction
// with the backward that produces the gradients: it knows the gradients up front, in the order the
// backward produces them; ready(i, g) copies gradient i into its bucket, and the moment a bucket
// holds all of its gradients its non-blocking all-reduce starts, so the wire works while the
// backward computes the next bucket. poll() lets the reductions in flight progress (MPI progresses
// non-blocking collectives only inside MPI calls, so the trainer polls between backward nodes).
// finish() waits for the rest. Every rank runs the same graph, so buckets start in the same order
// everywhere, as non-blocking collectives require.
//
// ZeRO-1 and 2 (ZeroMode sharded_moments and sharded_gradients, train/train_state.h): the same buckets, each padded
// with zeros to a multiple of the group size P, are reduce-scattered instead of all-reduced, so
// rank r receives only the summed elements [r·c, (r+1)·c) of every bucket (c = padded / P), its
// shard; finish_shards() returns them. At ZeRO-2 each bucket's full buffer is freed the moment its
// reduce-scatter has finished, so between steps gradient buffers take 1/P of the gradients' bytes.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "tensor/tensor.h"

namespace autosp {

struct GradSyncStats {
  size_t calls = 0, bytes = 0;
  // Time the caller was blocked on gradient communication: in finish() (waiting for the buckets,
  // or reducing them when overlap is off) plus starting and polling them. What overlap hides is
  // the reduction time that does not show up here.
  double exposed_seconds = 0;
  // The part of it spent in finish(): the tail the backward did not cover. The rest is spent in
  // start and poll calls, where on a CPU the MPI library does the reduction's own copying and
  // adding on the calling core (shared-memory transports have no engine of their own).
  double wait_seconds = 0;
};

GradSyncStats all_reduce_bucketed(Communicator& comm, std::vector<Tensor>& grads, size_t bucket_bytes = 32u << 20);

struct GradSlot {
  Shape shape;
  DType dtype;
};

// Where every gradient sits in the flat buckets: consecutive slots of one dtype, about bucket_bytes
// each, side by side; each bucket padded with zeros to a multiple of `ranks`.
struct FlatLayout {
  struct Bucket {
    size_t first = 0, last = 0;  // slots [first, last)
    int64_t numel = 0;           // the slots' elements
    int64_t padded = 0;          // numel rounded up to a multiple of ranks
    DType dtype = DType::f32;
  };
  int ranks = 1;
  std::vector<GradSlot> slots;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;   // per slot
  std::vector<int64_t> offset_of;  // per slot: its first element in its bucket

  int64_t shard_numel(size_t bucket) const { return buckets[bucket].padded / ranks; }
};
FlatLayout flat_layout(std::vector<GradSlot> slots, size_t bucket_bytes, int ranks);

class GradSync {
 public:
  using Slot = GradSlot;
  // `slots`: the gradients in the order the backward produces them. With `overlap` off, ready()
  // only copies and finish() reduces every bucket with blocking calls (to measure what overlap hides).
  // `mode` replicated all-reduces; sharded_moments and sharded_gradients reduce-scatter over comm
  // (sharded_gradients also frees each bucket once it is reduce-scattered).
  GradSync(Communicator& comm, std::vector<Slot> slots, bool overlap, size_t bucket_bytes,
           ZeroMode mode = ZeroMode::replicated);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Gradient `slot` is final: copy it into its bucket (each slot exactly once per step).
  void ready(size_t slot, const Tensor& grad);
  // Let started reductions progress; never blocks.
  void poll();
  // Waits for every bucket (a slot that was never ready is an assertion failure) and returns the
  // summed gradients in slot order, as views of the bucket buffers: valid until the next step's
  // ready(). Resets for the next step.
  std::vector<Tensor> finish();
  // ZeRO: the same wait, returning this rank's shard of every summed bucket (layout().shard_numel
  // elements each; valid until the next step's finish_shards()).
  std::vector<Tensor> finish_shards();

  size_t num_buckets() const { return buckets_.size(); }
  const FlatLayout& layout() const { return layout_; }
  // Bytes of the full bucket buffers allocated now (at ZeRO-2, none between steps).
  size_t bucket_bytes_held() const;
  // Cumulative over every step.
  const GradSyncStats& stats() const { return stats_; }

 private:
  struct Bucket {
    Tensor flat;   // the slots' gradients side by side (allocated by the first ready(), on its device)
    Tensor shard;  // ZeRO: this rank's summed chunk of `flat`
    size_t filled = 0;  // slots ready this step
    std::unique_ptr<PendingCollective> pending;
  };
  void allocate(size_t b, Device device);
  void start(size_t b);
  void done(size_t b);  // its collective has finished
  void wait_all();

  Communicator& comm_;
  FlatLayout layout_;
  bool overlap_;
  bool shard_;         // reduce-scatter into this rank's shard (ZeRO-1 and 2)
  bool free_buckets_;  // free each bucket once reduce-scattered (ZeRO-2)
  std::vector<Bucket> buckets_;
  std::vector<bool> seen_;
  size_t next_poll_ = 0;  // the oldest bucket that may still be in flight
  GradSyncStats stats_;
};

}  // namespace autosp
