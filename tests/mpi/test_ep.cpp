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
    const Config cfg1 = make_config(model, 1, {{"seq_len", 16}, {"batch_size", 2}});
    const ParamMap params = init_params(cfg1.model, 17, DType::f32);
    const Batch global = random_batch(2, 16, cfg1.model.vocab_size, 9);
    const LossAndGrads ref = run_reference(cfg1, global, params);
    for (const EpLayout& l : ep_layouts()) {
      if (l.world != w.size()) continue;
      INFO(model_name(model) << ": " << describe(l));
      check_ep_rank(run_ep_rank(w, model, l, global, params), w.rank(), l, ref);
    }
  }
  w.barrier();
}

}  // namespace autosp::test
