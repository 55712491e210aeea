// Expert parallelism (moe.expert_parallel_size G) with ranks as MPI processes: the layouts of
// tests/common/ep_case.h whose world is this run's (np 2: Ulysses 2 with G = 2; np 4: Ulysses,
// Ulysses × ring, dp × sp and activation checkpointing with G = 2 and 4), for Mixtral, Qwen2-MoE
// and Qwen3-MoE; each rank checks its loss, its dense gradients and its own experts' gradients
// against the one-process run it computes itself.
#include <catch2/catch.hpp>

#include "common/ep_case.h"
#include "mpi/mpi_test.h"

namespace autosp::test {

TEST_CASE("mpi ep: G = 2 and 4 equal one process for Mixtral, Qwen2-MoE and Qwen3-MoE", "[mpi][moe][ep]") {
  Communicator& w = test_world();
  for (const json& model : {kMixtral, kQwen2Moe, kQwen3Moe}) {
    const EpCase c = ep_case(model);
    for (const EpLayout& l : ep_layouts()) {
      if (l.world != w.size()) continue;
      INFO(model_name(model) << ": " << describe(l));
      check_ep_rank(run_ep_rank(w, model, l, c.global, c.params), w.rank(), l, c.ref);
    }
  }
  w.barrier();
}

}  // namespace autosp::test
