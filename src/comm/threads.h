// The thread communicator: P ranks as threads of one process (what the one-GPU machine needs, where
// NCCL refuses two ranks on one device, and what tests and single-node runs use without mpirun).
// Every rank is a thread with its own Communicator; the ranks of a group meet in shared memory:
// a collective publishes each rank's buffers, passes a barrier, each rank reads its peers' buffers
// into its own result, and a second barrier keeps every input alive until all have read it.
//   - CPU tensors: memcpy and sums in rank order (every rank gets bitwise the same sum).
//   - CUDA tensors: device copies and deterministic sums (device/buffers.h, which runs them as
//     cudaMemcpyAsync and kernels/cuda's sum_to) on the rank's compute stream, ordered across ranks by events recorded before each barrier:
//     a rank's stream waits for its peers' inputs to be ready and, before it goes on, for its
//     peers to have finished reading its own. Correct whether the ranks share a stream or not.
//   - run_thread_ranks runs rank r in stream slot r + 1 (device/stream_slot.h): on a GPU each rank
//     has a compute stream and a caching allocator of its own, ordered after the work the calling
//     thread had queued, and drained before the rank's thread ends. Ranks made by
//     make_thread_communicators run in whatever slot their threads are in.
//   - all_reduce_sum_async, reduce_scatter_sum_async, all_gather_async and send_recv_async run on a
//     worker thread of the communicator, in the order the
//     collectives were started (holding handles to the tensors: their storage must stay untouched,
//     the Tensor objects may go); a blocking collective first waits for the started ones. So the
//     rank's thread goes on while its peers catch up (ZeRO-3's prefetch does not stall the host).
//     On a GPU the worker's copies go on the rank's own compute stream (its stream slot): they
//     never wait for the host, but they do not run beside the rank's kernels either. Another
//     stream would not buy more: the ranks share one GPU, whose copies and kernels compete for
//     the same memory bandwidth.
//   - abort() ends the process (every rank of the job) with the exit code; a rank whose body
//     throws breaks the job: collectives on the other ranks then throw instead of waiting forever,
//     and run_thread_ranks rethrows the first rank's exception.
// Knows nothing of graphs.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace autosp {

namespace threads_detail {
class Group;
class Worker;
}  // namespace threads_detail

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<threads_detail::Group> group, int rank);
  ~ThreadCommunicator() override;  // runs the collectives already started, then joins its worker
  ThreadCommunicator(const ThreadCommunicator&) = delete;
  ThreadCommunicator& operator=(const ThreadCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override;
  std::string backend() const override { return "threads"; }
  void all_reduce_sum(Tensor& t) override;
  std::unique_ptr<PendingCollective> all_reduce_sum_async(Tensor& t) override;
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override;
  // Started on the worker like all_reduce_sum_async.
  std::unique_ptr<PendingCollective> reduce_scatter_sum_async(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void all_to_all(const Tensor& in, Tensor& out) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  // Started on the worker like all_reduce_sum_async.
  std::unique_ptr<PendingCollective> all_gather_async(const Tensor& in, Tensor& out) override;
  // One round of the whole group on the worker, like all_reduce_sum_async: every rank of the group
  // takes part (a shift around a ring) and copies its `src` peer's `send` into `recv`.
  std::unique_ptr<PendingCollective> send_recv_async(const Tensor& send, int dest, Tensor& recv, int src) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort(const std::string& message, int exit_code) override;

 private:
  void drain();
  void publish(const char* what, const Tensor* in, const Tensor* out, bool same_size = true);
  void finish(const char* what);
  void reduce_into(const Tensor& in, Tensor& out, bool chunk_of_rank, const char* what);
  void gather_into(const Tensor& in, Tensor& out, const char* what);
  std::unique_ptr<PendingCollective> start(const Tensor& in, Tensor& out,
                                           std::function<void(const Tensor&, Tensor&)> round);
  void record(void*& event);
  void wait_event(void* event);

  std::shared_ptr<threads_detail::Group> group_;
  const int rank_;
  Device device_;        // of the round in progress
  uint64_t splits_ = 0;  // split() calls so far (the same on every rank of the group)
  std::unique_ptr<threads_detail::Worker> worker_;
};

// The communicators of one world of `ranks` threads (rank i at index i): hand each to its thread.
std::vector<std::unique_ptr<ThreadCommunicator>> make_thread_communicators(int ranks);

// Runs body(world) for every rank of a world of `ranks` threads and waits for all of them. A
// rank that throws breaks the job (see above); the first exception thrown is rethrown here once
// every rank has returned. `ranks` < 1 is a UsageError.
void run_thread_ranks(int ranks, const std::function<void(ThreadCommunicator& world)>& body);

}  // namespace autosp
