// The process mesh: world = dp × sp, SP groups are consecutive world ranks (sp_rank = rank % sp,
// dp_rank = rank / sp). With ring attention (sequence_parallel.ring_size R > 1) an SP group is
// R ring ranks of U = sp / R consecutive Ulysses ranks (ulysses_rank = sp_rank % U, ring_rank =
// sp_rank / U): Ulysses groups stay inside a node, ring neighbours are U ranks apart. With expert
// parallelism (moe.expert_parallel_size E > 1) an expert group is E consecutive world ranks
// (ep_rank = rank % E), each holding 1/E of every MoE layer's experts; the ranks holding the same
// experts (the same ep_rank, world / E of them) form the expert-replica group that sums those
// experts' gradients (decision 162). rank_layout() is the one place that layout is computed and checked: the
// mesh (with its communicators) is one, and the program builder (compiler/program.h build_program)
// takes one to make the passes' context. Knows nothing of graphs.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.h"

namespace autosp {

// Where one rank sits in the mesh.
struct RankLayout {
  int world_size = 1, world_rank = 0;
  int sp = 1, sp_rank = 0;  // sp: ranks sharing one sequence (sequence_parallel.autosp_size)
  int dp = 1, dp_rank = 0;  // dp: copies of the model (world_size / sp)
  int ring = 1, ring_rank = 0;        // ring: R ring ranks per SP group (sequence_parallel.ring_size)
  int ulysses = 1, ulysses_rank = 0;  // ulysses: U = sp / ring consecutive ranks per ring rank
  int ep = 1, ep_rank = 0;            // ep: E consecutive ranks sharing the experts (moe.expert_parallel_size)
  // What the sequence length is padded to a multiple of: sp, or 2·sp with a ring (2R zigzag
  // chunks of U blocks each).
  int64_t seq_multiple() const { return ring > 1 ? 2 * int64_t{sp} : sp; }
};

// The sizes come as the config and the command line hold them (int64_t: sequence_parallel.autosp_size
// and ring_size as they are) and the layout hands them out as int, so no caller converts. A rank
// outside the world, a world of more ranks than an int holds, an sp that does not divide the world
// size, a ring that does not divide sp, or an ep that does not divide the world size is a UsageError.
RankLayout rank_layout(int64_t world_size, int64_t world_rank, int64_t sp, int64_t ring = 1, int64_t ep = 1);

// The layout of `world`'s rank, with its groups (split off `world`, a collective call on every rank).
struct ProcessMesh : RankLayout {
  std::unique_ptr<Communicator> sp_group;  // ranks sharing one sequence
  std::unique_ptr<Communicator> dp_group;  // ranks holding the same sequence shard
  // With a ring only (ring > 1; else null): the Ulysses group of this ring rank, and the ring.
  std::unique_ptr<Communicator> ulysses_group, ring_group;
  // With expert parallelism only (ep > 1; else null): the expert group and the expert-replica group.
  std::unique_ptr<Communicator> ep_group, ep_replica_group;
  // The executor's groups: "world" (`world`), "sp", "dp", with a ring "ulysses" and "ring", with
  // expert parallelism "ep" and "ep_replica".
  CommGroups groups(Communicator& world) const;
};
ProcessMesh make_mesh(Communicator& world, int64_t sp, int64_t ring = 1, int64_t ep = 1);

}  // namespace autosp
