// The dp × sp layout of the world and its SP / DP groups.
#include "comm/mesh.h"

namespace autosp {

RankLayout rank_layout(int world_size, int world_rank, int sp) {
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
  return l;
}

ProcessMesh make_mesh(Communicator& world, int sp) {
  ProcessMesh m;
  static_cast<RankLayout&>(m) = rank_layout(world.size(), world.rank(), sp);
  m.sp_group = world.split(m.dp_rank, m.sp_rank);
  m.dp_group = world.split(m.sp_rank, m.dp_rank);
  return m;
}

}  // namespace autosp
