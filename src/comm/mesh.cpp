// The dp × sp layout of the world and its SP / DP groups.
#include "comm/mesh.h"

#include <limits>

namespace autosp {

RankLayout rank_layout(int64_t world_size, int64_t world_rank, int64_t sp, int64_t ring, int64_t ep) {
  if (world_size < 1 || world_rank < 0 || world_rank >= world_size)
    throw UsageError(str("rank ", world_rank, " is outside a world of ", world_size));
  if (world_size > std::numeric_limits<int>::max())
    throw UsageError(str("a world of ", world_size, " ranks: at most ", std::numeric_limits<int>::max()));
  if (sp < 1 || world_size % sp != 0)
    throw UsageError(str("sequence_parallel.autosp_size ", sp, " does not divide the world size ", world_size,
                         " (world = dp x sp)"));
  if (ring < 1 || sp % ring != 0)
    throw UsageError(str("sequence_parallel.ring_size ", ring, " does not divide sequence_parallel.autosp_size ", sp));
  if (ep < 1 || world_size % ep != 0)
    throw UsageError(str("moe.expert_parallel_size ", ep, " does not divide the world size ", world_size,
                         " (an expert group is that many consecutive ranks)"));
  // Every size is now at most world_size, which an int holds.
  const int W = static_cast<int>(world_size), r = static_cast<int>(world_rank), P = static_cast<int>(sp),
            R = static_cast<int>(ring);
  RankLayout l;
  l.world_size = W;
  l.world_rank = r;
  l.sp = P;
  l.sp_rank = r % P;
  l.dp = W / P;
  l.dp_rank = r / P;
  l.ring = R;
  l.ulysses = P / R;
  l.ulysses_rank = l.sp_rank % l.ulysses;
  l.ring_rank = l.sp_rank / l.ulysses;
  l.ep = static_cast<int>(ep);
  l.ep_rank = r % l.ep;
  return l;
}

ProcessMesh make_mesh(Communicator& world, int64_t sp, int64_t ring, int64_t ep) {
  ProcessMesh m;
  static_cast<RankLayout&>(m) = rank_layout(world.size(), world.rank(), sp, ring, ep);
  m.sp_group = world.split(m.dp_rank, m.sp_rank);
  m.dp_group = world.split(m.sp_rank, m.dp_rank);
  if (m.ring > 1) {
    m.ulysses_group = m.sp_group->split(m.ring_rank, m.ulysses_rank);
    m.ring_group = m.sp_group->split(m.ulysses_rank, m.ring_rank);
  }
  if (m.ep > 1) {
    m.ep_group = world.split(m.world_rank / m.ep, m.ep_rank);
    m.ep_replica_group = world.split(m.ep_rank, m.world_rank / m.ep);
  }
  return m;
}

CommGroups ProcessMesh::groups(Communicator& world) const {
  CommGroups g{{"world", &world}, {"sp", sp_group.get()}, {"dp", dp_group.get()}};
  if (ring_group) g["ulysses"] = ulysses_group.get(), g["ring"] = ring_group.get();
  if (ep_group) g["ep"] = ep_group.get(), g["ep_replica"] = ep_replica_group.get();
  return g;
}

}  // namespace autosp
