// Expert parallelism (moe.expert_parallel_size G) with ranks as MPI processes: the layouts of
// tests/common/ep_case.h whose world is this run's (np 2: Ulysses 2 with G = 2; np 4: Ulysses,
// Ulysses × ring, dp × sp and activation checkpointing with G = 2 and 4), for Mixtral, Qwen2-MoE
// and Qwen3-MoE; each rank checks its loss, its dense gradients and its own experts' gradients
// against the one-process run it computes itself. Through train() with ZeRO 1, 2 and 3 (decision
// 185): E = world (np 2: Ulysses 2; np 4: dp 2 × sp 2) and, at np 4, E = 2 with the experts'
// state sharded over 2 replicas; every rank's losses, norms and final whole weights equal the
// one-process run's. DPO (tests/common/ep_dpo_case.h) with E = 2: np 2 Ulysses 2 and dp 2, np 4
// dp 2 × sp 2 at ZeRO 0 and 3, with dpo.precompute_ref off and on, against the one-process run.
#include <catch2/catch.hpp>

#include <filesystem>

#include "common/ep_dpo_case.h"
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

TEST_CASE("mpi ep: train() with ZeRO 1, 2 and 3 equals one process", "[mpi][moe][ep][zero]") {
  Communicator& w = test_world();
  const TrainResult ref = train_one_process(kQwen2Moe);
  const int W = w.size();
  std::vector<EpLayout> layouts{{W, W == 4 ? 2 : W, 1, W}};
  if (W == 4) layouts.push_back({4, 4, 1, 2, true});
  for (const EpLayout& l : layouts)
    for (int64_t stage = 1; stage <= 3; ++stage) {
      INFO(describe(l) << ", ZeRO " << stage);
      check_train_like(train(ep_train_config(kQwen2Moe, l, stage), quiet_args(), w), ref);
    }
  w.barrier();
}

TEST_CASE("mpi ep: DPO with E = 2 equals one process, with and without dpo.precompute_ref", "[mpi][moe][ep][dpo]") {
  Communicator& w = test_world();
  const TempDir shared = shared_temp_dir(w, "ep-dpo");
  const TempDir own("ep-dpo-one");  // this rank's one-process run writes its reference file here
  if (w.rank() == 0) write_ep_pairs(shared);
  write_ep_pairs(own);
  const int W = w.size();
  std::vector<std::pair<EpLayout, int64_t>> layouts{{{W, 2, 1, 2}, 0}};
  if (W == 2) layouts.push_back({{2, 1, 1, 2}, 0});
  if (W == 4) layouts.push_back({{4, 2, 1, 2}, 3});
  for (const json& model : {kMixtral, kQwen2Moe})
    for (const bool precompute : {false, true}) {
      const json extra = {{"dpo", {{"precompute_ref", precompute}}}};
      std::filesystem::remove(own.path("ref_logps_train.safetensors"));
      auto single = make_single_process_communicator();
      const TrainResult ref = train(ep_dpo_config(own, model, {1, 1, 1, 1}, 0, extra), quiet_args(), *single);
      for (const auto& [l, stage] : layouts) {
        INFO(model_name(model) << ": " << describe(l) << ", ZeRO " << stage << ", precompute_ref " << precompute);
        w.barrier();  // every rank is past its last read before rank 0 removes the file
        if (w.rank() == 0) std::filesystem::remove(shared.path("ref_logps_train.safetensors"));
        w.barrier();
        check_dpo_like(train(ep_dpo_config(shared, model, l, stage, extra), quiet_args(), w), ref);
      }
    }
  w.barrier();
}

}  // namespace autosp::test
