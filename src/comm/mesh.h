// The process mesh: world = dp × sp, SP groups are consecutive world ranks (sp_rank = rank % sp,
// dp_rank = rank / sp). rank_layout() is the one place that layout is computed and checked: the
// mesh (with its communicators) is one, and the program builder (compiler/program.h build_program)
// takes one to make the passes' context. Knows nothing of graphs.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace autosp {

// Where one rank sits in the mesh.
struct RankLayout {
  int world_size = 1, world_rank = 0;
  int sp = 1, sp_rank = 0;  // sp: ranks sharing one sequence (sequence_parallel.autosp_size)
  int dp = 1, dp_rank = 0;  // dp: copies of the model (world_size / sp)
};

// A rank outside the world, or an sp that does not divide the world size, is a UsageError.
RankLayout rank_layout(int world_size, int world_rank, int sp);

// The layout of `world`'s rank, with its groups (split off `world`, a collective call on every rank).
struct ProcessMesh : RankLayout {
  std::unique_ptr<Communicator> sp_group;  // ranks sharing one sequence
  std::unique_ptr<Communicator> dp_group;  // ranks holding the same sequence shard
};
ProcessMesh make_mesh(Communicator& world, int sp);

}  // namespace autosp
