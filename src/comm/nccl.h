// The NCCL communicator: the Communicator interface over NCCL for CUDA device tensors, one GPU per
// rank. Built when CUDA, MPI and NCCL are all found (AUTOSP_WITH_NCCL); the factory of a build
// without them throws RuntimeFailure. Knows nothing of graphs; the caller selects the device.
//
// How a training job creates it (one process per GPU, launched by mpirun; comm/job_comms.cpp):
//   auto mpi_world = make_world_communicator();            // MPI: the bootstrap, and host tensors
//   select_device_for_local_rank();                        // device/cuda (before anything below)
//   auto world = make_nccl_communicator(*mpi_world, compute_stream, collective_timeout_from_env());
//   ProcessMesh mesh = make_mesh(*world, sp);              // sp/dp groups: ncclCommSplit, same mesh
// `mpi_world` must outlive `world` and every group split off it (abort() ends the job through it).
// Wrap `world` in GuardedCommunicator / CountingCommunicator as with MPI, but keep the
// NcclCommunicator pointer for synchronize().
//
// Streams. Each communicator owns a non-blocking stream; a collective records an event on the
// compute stream, makes its own stream wait for it (so it sees every kernel enqueued before the
// call), enqueues the NCCL call and records a done event. The "blocking" collectives then make the
// compute stream wait for the done event and return at once: the result is visible to all work
// enqueued afterwards on the compute stream, but the host has not waited. all_reduce_sum_async,
// reduce_scatter_sum_async and all_gather_async (ZeRO-3's prefetch) return without that wait, so
// kernels enqueued meanwhile run beside the collective; PendingCollective::test() is
// cudaEventQuery of the done event and wait() makes the compute stream wait for it (neither blocks
// the host); a PendingCollective must not outlive its communicator, and the tensors of a pending
// one must stay alive until it is waited for (the launchers' handles hold them). Collectives run on
// the communicator's stream in call order. Tensors freed after a blocking collective are safe to
// reuse from the compute stream (it waited).
//
// Where the host must wait (it needs the data, or it must know every rank got there), it polls —
// never blocks in CUDA or NCCL — and gives up after `timeout_s` seconds: barrier() and
// synchronize() wait for every collective enqueued so far on this communicator; on a NCCL error
// or the deadline they abort the NCCL communicator (ncclCommAbort) and throw RuntimeFailure. Read
// a collective's result on the host (the loss, the gradient norm) only after synchronize(): a
// cudaMemcpy on the compute stream would otherwise block the host forever behind a hung peer.
//
// Errors: a failed NCCL or CUDA call throws RuntimeFailure naming the call, file:line,
// ncclGetErrorString and ncclGetLastError. A CPU or non-contiguous tensor is an AUTOSP_ASSERT.
// abort() aborts the NCCL communicator, then ends the job through the bootstrap (MPI_Abort).
// Dtypes of all_reduce_sum: f32, f64, bf16, i64. all_to_all accepts in == out (through a
// stream-ordered scratch copy; NCCL's all-to-all is not in place).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace autosp {

class NcclCommunicator : public Communicator {
 public:
  // Waits on the host (polling, within the deadline) until every collective enqueued so far on
  // this communicator has finished. Throws RuntimeFailure on a NCCL error or the deadline.
  virtual void synchronize() = 0;
};

// True when this build has the NCCL backend.
bool nccl_built();

// A NCCL communicator over the ranks of `bootstrap` (same ranks, same order): rank 0 creates the
// unique id and broadcasts it over `bootstrap`; a collective call on every rank. The current CUDA
// device is this rank's GPU. `compute_stream` is the cudaStream_t the executor's kernels run on
// (nullptr = the legacy default stream). `timeout_s`: the deadline of every host-side wait,
// communicator creation included (AUTOSP_COLLECTIVE_TIMEOUT: pass collective_timeout_from_env()).
std::unique_ptr<NcclCommunicator> make_nccl_communicator(Communicator& bootstrap, void* compute_stream,
                                                         double timeout_s);

}  // namespace autosp
