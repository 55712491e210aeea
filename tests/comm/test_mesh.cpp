// The rank layout (comm/mesh.h rank_layout): world = dp × sp with consecutive SP groups, the one
// computation the process mesh and the program builder's passes' context share, and its errors.
#include <catch2/catch.hpp>

#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "compiler/program.h"

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

TEST_CASE("rank_layout: expert groups are E consecutive ranks; an E the world size refuses names the key",
          "[comm]") {
  for (int rank = 0; rank < 8; ++rank) {
    const RankLayout l = rank_layout(8, rank, 2, 1, 4);
    CHECK(l.ep == 4);
    CHECK(l.ep_rank == rank % 4);
    CHECK(l.sp_rank == rank % 2);  // independent of the SP layout
  }
  CHECK(rank_layout(4, 3, 4).ep == 1);
  CHECK_THROWS_WITH(rank_layout(6, 0, 2, 1, 4),
                    "moe.expert_parallel_size 4 does not divide the world size 6 (an expert group is that many "
                    "consecutive ranks)");
  CHECK_THROWS_AS(rank_layout(4, 0, 1, 1, 0), UsageError);
  CHECK_THROWS_AS(rank_layout(4, 0, 1, 1, -4), UsageError);
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

TEST_CASE("rank_layout: takes the config's int64 sizes and checks them before handing out ints", "[comm]") {
  // What a cast to int would have made 2 (2^32 + 2) is named as it is.
  const int64_t wraps_to_2 = (int64_t{1} << 32) + 2;
  CHECK_THROWS_WITH(rank_layout(4, 0, wraps_to_2),
                    "sequence_parallel.autosp_size 4294967298 does not divide the world size 4 (world = dp x sp)");
  CHECK_THROWS_WITH(rank_layout(4, 0, 2, wraps_to_2),
                    "sequence_parallel.ring_size 4294967298 does not divide sequence_parallel.autosp_size 2");
  CHECK_THROWS_WITH(rank_layout(wraps_to_2, 0, 1), "a world of 4294967298 ranks: at most 2147483647");
  Config cfg;
  cfg.sequence_parallel.autosp_size = 4;
  cfg.sequence_parallel.ring_size = 2;
  const RankLayout l = rank_layout(8, 5, cfg.sequence_parallel.autosp_size, cfg.sequence_parallel.ring_size);
  // sp, dp, ring, ulysses and rank 5's place in each: sp_rank 1, dp_rank 1, ring_rank 0, ulysses_rank 1.
  CHECK(std::vector<int>{l.sp, l.dp, l.ring, l.ulysses} == std::vector<int>{4, 2, 2, 2});
  CHECK(std::vector<int>{l.sp_rank, l.dp_rank, l.ring_rank, l.ulysses_rank} == std::vector<int>{1, 1, 0, 1});
}

// The program builder makes the passes' context from the layout it is given: rank r's program
// keeps sequence block sp_rank of S//sp.
TEST_CASE("the program builder shards the sequence as the rank layout places the rank", "[comm]") {
  Config cfg;
  cfg.model.arch = Arch::llama;
  cfg.model.vocab_size = 64;
  cfg.model.hidden_size = 16;
  cfg.model.num_hidden_layers = 1;
  cfg.model.num_attention_heads = 2;
  cfg.model.num_key_value_heads = 2;
  cfg.model.intermediate_size = 32;
  cfg.sequence_parallel.autosp_size = 2;
  for (int rank = 0; rank < 6; ++rank) {
    INFO("rank " << rank);
    const RankLayout l = rank_layout(6, rank, 2);
    const RankProgram prog = build_program(cfg, DType::f32, Stage::rank_forward, l);
    const Node* slice = prog.graph->find("input_ids.r");
    REQUIRE(slice != nullptr);
    const Dim block = Dim::sym("S").floordiv(l.sp);
    CHECK(slice->attrs().dim("start") == Dim(l.sp_rank) * block);
    CHECK(slice->attrs().dim("end") == Dim(l.sp_rank + 1) * block);
  }
}

}  // namespace
}  // namespace autosp
