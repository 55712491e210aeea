// The dp × sp layout of the world and its SP / DP groups.
#include "comm/mesh.h"

namespace autosp {

RankLayout rank_layout(int world_size, int world_rank, int sp, int ring) {
  if (world_size < 1 || world_rank < 0 || world_rank >= world_size)
    throw UsageError(str("rank ", world_rank, " is outside a world of ", world_size));
  if (sp < 1 || world_size % sp != 0)
    throw UsageError(str("sequence_parallel.autosp_size ", sp, " does not divide the world size ", world_size,
                         " (world = dp x sp)"));
  RankLayout l;
  l.world_size = world_size;
  l.world_rank = world_rank;
  l.sp = sp;
  l.sp_rank = world_rank % sp;
  l.dp = world_size / sp;
  l.dp_rank = world_rank / sp;
  if (ring < 1 || sp % ring != 0)
    throw UsageError(str("sequence_parallel.ring_size ", ring, " does not divide sequence_parallel.autosp_size ", sp));
  l.ring = ring;
  l.ulysses = sp / ring;
  l.ulysses_rank = l.sp_rank % l.ulysses;
  l.ring_rank = l.sp_rank / l.ulysses;
  return l;
}

ProcessMesh make_mesh(Communicator& world, int sp, int ring) {
  ProcessMesh m;
  static_cast<RankLayout&>(m) = rank_layout(world.size(), world.rank(), sp, ring);
  m.sp_group = world.split(m.dp_rank, m.sp_rank);
  m.dp_group = world.split(m.sp_rank, m.dp_rank);
  if (ring > 1) {
    m.ulysses_group = m.sp_group->split(m.ring_rank, m.ulysses_rank);
    m.ring_group = m.sp_group->split(m.ulysses_rank, m.ring_rank);
  }
  return m;
}

CommGroups ProcessMesh::groups(Communicator& world) const {
  CommGroups g{{"world", &world}, {"sp", sp_group.get()}, {"dp", dp_group.get()}};
  if (ring_group) g["ulysses"] = ulysses_group.get(), g["ring"] = ring_group.get();
  return g;
}

}  // namespace autosp
