// SP on one GPU: AutoSP training with P = 1, 2, 4 ranks as threads of this process
// (comm/threads.h), all on CUDA device 0 (each rank's collectives are device copies ordered by
// events), against single-process CPU training, in f32 and bf16, for Llama (GQA with 2 KV heads:
// all-to-all'd at P = 2, replicated at P = 4) and GPT-2, and on a sequence length P does not
// divide, and at ZeRO stage 3. The bar and the tolerances are the MPI GPU test's (tests/cuda/sp_equivalence.h); the
// CPU twin of this test is tests/comm/test_thread_sp.cpp.
#include <catch2/catch.hpp>

#include <vector>

#include "comm/threads.h"
#include "cuda/sp_equivalence.h"

using namespace autosp;

namespace {

// Rank 0's result of train() on every rank of a world of P rank threads.
cudatest::TrainOnRanks on_thread_ranks(int P) {
  return [P](const Config& cfg, const TrainArgs& args) {
    std::vector<TrainResult> results(static_cast<size_t>(P));
    run_thread_ranks(P, [&](ThreadCommunicator& w) { results[static_cast<size_t>(w.rank())] = train(cfg, args, w); });
    return results[0];
  };
}

TEST_CASE("thread sp on one GPU: f32 equals single-process CPU training", "[gpu][sp][threads]") {
  for (const int P : {1, 2, 4})
    for (const std::string arch : {"llama", "gpt2"}) {
      cudatest::compare(arch, "float32", P, 1e-4, 1e-3, on_thread_ranks(P), true);
      if (P > 1) cudatest::compare(arch, "float32", P, 1e-4, 1e-3, on_thread_ranks(P), true, 63);  // padded
    }
}

TEST_CASE("thread sp on one GPU: bf16 tracks the CPU's bf16 emulation", "[gpu][sp][threads]") {
  for (const int P : {1, 2, 4})
    for (const std::string arch : {"llama", "gpt2"}) cudatest::compare(arch, "bfloat16", P, 1e-2, 3e-2, on_thread_ranks(P), true);
}

// ZeRO-3 on the same ranks: parameters sharded over the 2 or 4 rank threads, gathered per layer
// (device copies), every gradient reduce-scattered in the graph (graph/passes/shard_parameters.h).
TEST_CASE("thread sp on one GPU: ZeRO stage 3 equals single-process CPU training", "[gpu][sp][threads][zero]") {
  for (const int P : {2, 4})
    for (const std::string arch : {"llama", "gpt2"}) {
      const cudatest::TrainOnRanks zero3 = [P](const Config& cfg, const TrainArgs& args) {
        Config c = cfg;
        c.zero_optimization.stage = 3;
        return on_thread_ranks(P)(c, args);
      };
      cudatest::compare(arch, "float32", P, 1e-4, 1e-3, zero3, true);
      cudatest::compare(arch, "float32", P, 1e-4, 1e-3, zero3, true, 63);  // padded
    }
}

}  // namespace
