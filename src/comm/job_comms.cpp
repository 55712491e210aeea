// The communicators of one training rank: NCCL or MPI for device tensors, the mesh, the watchdog.
#include "comm/job_comms.h"

#include <spdlog/spdlog.h>

#include "device/cuda/device.h"

namespace autosp {

void JobComms::synchronize_device() {
  if (nccl) nccl->synchronize();
}

std::unique_ptr<JobComms> make_job_comms(Communicator& world, Device device, int64_t sp, int64_t ring, int64_t ep) {
  auto c = std::make_unique<JobComms>();
  // Thread ranks (comm/threads.h) move device tensors themselves: NCCL would refuse several ranks
  // on one GPU anyway.
  const bool world_moves_device_tensors = world.backend() == "threads";
  if (device.kind == DeviceKind::cuda && world.size() > 1 && !world_moves_device_tensors) {
    if (!nccl_built())
      throw UsageError("runtime.device \"cuda\" on more than one rank needs NCCL, which this build does not have "
                       "(install NCCL and reconfigure)");
    c->nccl = make_nccl_communicator(world, compute_stream(device.index), collective_timeout_from_env());
  }
  c->device_world = c->nccl ? static_cast<Communicator*>(c->nccl.get()) : &world;
  c->mesh = make_mesh(*c->device_world, sp, ring, ep);
  c->watchdog = std::make_unique<Watchdog>(
      collective_timeout_from_env(), world.rank(),
      [&world](const std::string& msg) {
        if (auto file = spdlog::get("train.log")) {  // the run's log file (apps/train.cpp)
          file->error("{}", msg);
          file->flush();
        }
        world.abort(msg, 3);
      },
      world.size() > 1);
  Watchdog& w = *c->watchdog;
  c->world = std::make_unique<GuardedCommunicator>(*c->device_world, w, "world");
  c->sp = std::make_unique<GuardedCommunicator>(*c->mesh.sp_group, w, "sp");
  c->dp = std::make_unique<GuardedCommunicator>(*c->mesh.dp_group, w, "dp");
  if (c->nccl) c->host = std::make_unique<GuardedCommunicator>(world, w, "world");
  c->host_world = c->host ? static_cast<Communicator*>(c->host.get()) : c->world.get();
  c->groups = {{"world", c->world.get()}, {"sp", c->sp.get()}, {"dp", c->dp.get()}};
  if (c->mesh.ring_group) {
    c->ulysses = std::make_unique<GuardedCommunicator>(*c->mesh.ulysses_group, w, "ulysses");
    c->ring = std::make_unique<GuardedCommunicator>(*c->mesh.ring_group, w, "ring");
    c->groups["ulysses"] = c->ulysses.get();
    c->groups["ring"] = c->ring.get();
  }
  if (c->mesh.ep_group) {
    c->ep = std::make_unique<GuardedCommunicator>(*c->mesh.ep_group, w, "ep");
    c->ep_replica = std::make_unique<GuardedCommunicator>(*c->mesh.ep_replica_group, w, "ep_replica");
    c->groups["ep"] = c->ep.get();
    c->groups["ep_replica"] = c->ep_replica.get();
  }
  return c;
}

}  // namespace autosp
