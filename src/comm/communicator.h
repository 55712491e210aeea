// The Communicator interface: collectives over a group of ranks. Backends: single-process
// (comm/single.cpp), MPI (comm/mpi.cpp) and NCCL (with the CUDA backend). Tensors are contiguous
// and live on the backend's device; collectives are blocking, except all_reduce_sum_async,
// reduce_scatter_sum_async, all_gather_async and send_recv_async, which return a PendingCollective
// (the gradient all-reduce, or ZeRO's reduce-scatter, overlaps with the backward with it; ZeRO-3's
// parameter gathers with the layer before; ring attention's block exchange with the block's
// attention). A failed
// collective throws RuntimeFailure; abort() ends every rank of the job. Knows nothing of graphs.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace autosp {

// A collective in flight. test() makes progress without blocking and says whether it has finished;
// wait() blocks until it has. After either says so, the result is visible to the host (CPU tensors)
// or to work enqueued afterwards on the device's compute stream (CUDA tensors). The tensor handed to
// the call must stay alive and untouched until then. Destroying an unfinished one waits for it.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

// One that has already finished (what a blocking backend returns).
std::unique_ptr<PendingCollective> finished_collective();
// `inner`, then `then()` once, on the host, the first time test() or wait() sees it finished (a
// copy out of the buffer it received into).
std::unique_ptr<PendingCollective> followed_by(std::unique_ptr<PendingCollective> inner, std::function<void()> then);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // Sum `t` over the group, in place (f32, f64, i64).
  virtual void all_reduce_sum(Tensor& t) = 0;
  // The same, started and returned without waiting: every rank must start its non-blocking
  // collectives in the same order. The default runs the blocking call.
  virtual std::unique_ptr<PendingCollective> all_reduce_sum_async(Tensor& t) {
    all_reduce_sum(t);
    return finished_collective();
  }
  // Copy root's `t` into every rank's `t` (same shape and dtype everywhere).
  virtual void broadcast(Tensor& t, int root) = 0;
  // `in` holds size() equal contiguous chunks; chunk j goes to rank j, and `out` (same byte size)
  // receives the chunk each rank i sent here, in rank order (MPI_Alltoall semantics).
  virtual void all_to_all(const Tensor& in, Tensor& out) = 0;
  // out = the concatenation of every rank's `in` in rank order (out has size()× its bytes).
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // The same, started and returned without waiting (the ordering rule of all_reduce_sum_async;
  // `in` and `out` stay alive and untouched until it finishes): ZeRO-3's parameter prefetch. The
  // default runs the blocking call.
  virtual std::unique_ptr<PendingCollective> all_gather_async(const Tensor& in, Tensor& out) {
    all_gather(in, out);
    return finished_collective();
  }
  // `in` holds size() equal contiguous chunks; `out`, one chunk's bytes, receives the sum over ranks
  // of chunk rank() (MPI_Reduce_scatter_block semantics; f32, f64, i64; bf16 on NCCL).
  virtual void reduce_scatter_sum(const Tensor& in, Tensor& out) = 0;
  // The same, started and returned without waiting (the ordering rule of all_reduce_sum_async;
  // `in` and `out` stay alive and untouched until it finishes). The default runs the blocking call.
  virtual std::unique_ptr<PendingCollective> reduce_scatter_sum_async(const Tensor& in, Tensor& out) {
    reduce_scatter_sum(in, out);
    return finished_collective();
  }
  // Point to point, started and returned without waiting: `send` goes to rank `dest` while `recv`
  // receives what rank `src` sends here (exactly recv's bytes; either side may be empty, and an
  // empty one is no message); `send` and `recv` stay alive and untouched until it finishes. Every
  // rank of the group calls it in the same round (a shift around a ring: ring attention's K/V
  // blocks, or the tails its window needs; MPI_Isend + MPI_Irecv, NCCL's grouped send/recv). The
  // default, for backends without it, throws RuntimeFailure.
  virtual std::unique_ptr<PendingCollective> send_recv_async(const Tensor& send, int dest, Tensor& recv, int src);
  virtual void barrier() = 0;
  // A sub-group of the ranks with the same `color`, ordered by `key` (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Ends every rank of the job with `message` on stderr and `exit_code` (never returns).
  [[noreturn]] virtual void abort(const std::string& message, int exit_code) = 0;
};

// Process groups by the names collectives use in their "group" attribute ("sp", "world", "dp").
using CommGroups = std::map<std::string, Communicator*>;

// One rank, no communication: collectives over a group of one.
std::unique_ptr<Communicator> make_single_process_communicator();

// The world: MPI when this build has it and the process was launched by mpirun (or an MPI
// launcher), else single-process. Initialises MPI on first use; MPI is finalised at exit.
std::unique_ptr<Communicator> make_world_communicator();

}  // namespace autosp
