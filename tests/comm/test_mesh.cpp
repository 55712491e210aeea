// The rank layout (comm/mesh.h rank_layout): world = dp × sp with consecutive SP groups, the one
// computation the process mesh and the AutoSP passes' context share, and its errors.
#include <catch2/catch.hpp>

#include "comm/mesh.h"
#include "config/config.h"
#include "engine/program.h"

namespace autosp {
namespace {

TEST_CASE("rank_layout: consecutive SP groups, dp = world / sp", "[comm]") {
  for (int world : {1, 2, 4, 6, 8}) {
    for (int sp = 1; sp <= world; ++sp) {
      if (world % sp != 0) continue;
      for (int rank = 0; rank < world; ++rank) {
        INFO("world " << world << " sp " << sp << " rank " << rank);
        const RankLayout l = rank_layout(world, rank, sp);
        CHECK(l.world_size == world);
        CHECK(l.world_rank == rank);
        CHECK(l.sp == sp);
        CHECK(l.dp == world / sp);
        CHECK(l.sp_rank == rank % sp);
        CHECK(l.dp_rank == rank / sp);
        CHECK(l.dp_rank * sp + l.sp_rank == rank);
      }
    }
  }
}

TEST_CASE("rank_layout: a world sp does not divide, or a rank outside it, is a usage error", "[comm]") {
  CHECK_THROWS_WITH(rank_layout(6, 0, 4),
                    "sequence_parallel.autosp_size 4 does not divide the world size 6 (world = dp x sp)");
  CHECK_THROWS_AS(rank_layout(2, 0, 0), UsageError);
  CHECK_THROWS_AS(rank_layout(2, 0, -2), UsageError);
  CHECK_THROWS_WITH(rank_layout(2, 2, 1), "rank 2 is outside a world of 2");
  CHECK_THROWS_AS(rank_layout(2, -1, 1), UsageError);
  CHECK_THROWS_AS(rank_layout(0, 0, 1), UsageError);
}

TEST_CASE("the passes' context is the rank layout's", "[comm]") {
  Config cfg;
  cfg.sequence_parallel.autosp_size = 2;
  for (int rank = 0; rank < 6; ++rank) {
    const PassContext ctx = pass_context(cfg, 6, rank);
    const RankLayout l = rank_layout(6, rank, 2);
    CHECK(ctx.sp_size == l.sp);
    CHECK(ctx.sp_rank == l.sp_rank);
    CHECK(ctx.world_size == l.world_size);
  }
}

}  // namespace
}  // namespace autosp
