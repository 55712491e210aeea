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
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"
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

class GradSync {
 public:
  struct Slot {
    Shape shape;
    DType dtype;
  };
  // `slots`: the gradients in the order the backward produces them. With `overlap` off, ready()
  // only copies and finish() reduces every bucket with blocking calls (to measure what overlap hides).
  GradSync(Communicator& comm, std::vector<Slot> slots, bool overlap, size_t bucket_bytes);
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

  size_t num_buckets() const { return buckets_.size(); }
  // Cumulative over every step.
  const GradSyncStats& stats() const { return stats_; }

 private:
  struct Bucket {
    Tensor flat;  // the slots' gradients side by side (allocated by the first ready(), on its device)
    int64_t numel = 0;
    size_t first = 0, last = 0;  // slots [first, last)
    size_t filled = 0;           // slots ready this step
    std::unique_ptr<PendingCollective> pending;
  };
  void start(Bucket& b);

  Communicator& comm_;
  std::vector<Slot> slots_;
  bool overlap_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_, offset_of_;  // per slot: its bucket and byte offset in it
  std::vector<bool> seen_;
  size_t next_poll_ = 0;  // the oldest bucket that may still be in flight
  GradSyncStats stats_;
};

}  // namespace autosp
