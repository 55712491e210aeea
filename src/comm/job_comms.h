// What one rank of a training job communicates over, built in one place from the world
// communicator, the device the rank computes on and the SP degree:
//   - the device world: NCCL over the world's ranks when the device is CUDA and the world has
//     several ranks (bootstrapped over the world, comm/nccl.h), else the world itself (always for
//     thread ranks, comm/threads.h, which copy device tensors themselves);
//   - the process mesh of the device world (comm/mesh.h), whose SP and DP groups the graph's
//     collectives use;
//   - the watchdog (comm/watchdog.h) and, under it, every communicator the job uses (comm/guarded.h):
//     the groups "world", "sp", "dp" for the executor, and the host world for host tensors (initial
//     weights, accuracy counts), which is the MPI world even when device tensors go over NCCL.
// The caller selects the device first and keeps the world alive longer than the JobComms. Knows
// nothing of graphs or models.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/guarded.h"
#include "comm/mesh.h"
#include "comm/nccl.h"
#include "comm/watchdog.h"
#include "tensor/allocator.h"

namespace autosp {

struct JobComms {
  std::unique_ptr<NcclCommunicator> nccl;  // null unless the device world is NCCL
  Communicator* device_world = nullptr;    // nccl, or the world
  ProcessMesh mesh;                        // of the device world
  // Ends the job (Communicator::abort, exit code 3) when a collective outlasts
  // AUTOSP_COLLECTIVE_TIMEOUT; it runs only when the world has several ranks.
  std::unique_ptr<Watchdog> watchdog;
  std::unique_ptr<GuardedCommunicator> world, sp, dp;  // the device world and the mesh's groups
  std::unique_ptr<GuardedCommunicator> ulysses, ring;  // with ring attention only (else null)
  std::unique_ptr<GuardedCommunicator> ep, ep_replica;  // with expert parallelism only (else null)
  std::unique_ptr<GuardedCommunicator> host;           // the world, when the device world is not
  Communicator* host_world = nullptr;                  // host tensors: `host`, else `world`
  CommGroups groups;  // {"world", "sp", "dp"} (+ "ulysses", "ring" with a ring, "ep", "ep_replica" with EP)

  // Waits until the device world's collectives have finished (a no-op without NCCL): read device
  // results on the host only after it, so a hung peer fails NCCL's deadline instead of blocking a
  // copy forever.
  void synchronize_device();
};

// `device`: where this rank computes (its CUDA device is already the current one). A CUDA job of
// several ranks in a build without NCCL is a UsageError; a malformed AUTOSP_COLLECTIVE_TIMEOUT too.
std::unique_ptr<JobComms> make_job_comms(Communicator& world, Device device, int64_t sp, int64_t ring = 1,
                                         int64_t ep = 1);

}  // namespace autosp
