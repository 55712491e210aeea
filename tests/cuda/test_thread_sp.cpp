// SP on one GPU: AutoSP training with P = 1, 2, 4 ranks as threads of this process
// (comm/threads.h), all on CUDA device 0 (each rank's collectives are device copies ordered by
// events), against single-process CPU training, in f32 and bf16, for Llama (GQA with 2 KV heads:
// all-to-all'd at P = 2, replicated at P = 4) and GPT-2, and on a sequence length P does not
// divide, at ZeRO stage 3, and with ring attention (Ulysses 2 × ring 2, a ring of 4). The bar and the tolerances are the MPI GPU test's (tests/cuda/sp_equivalence.h); the
// CPU twin of this test is tests/comm/test_thread_sp.cpp. First, that each rank thread has a
// compute stream and an allocator of its own, ordered after the caller's work and drained before
// the caller reads what the ranks made (device/stream_slot.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "comm/threads.h"
#include "cuda/dispatch_test.h"
#include "cuda/sp_equivalence.h"
#include "device/cuda/optim.h"

using namespace autosp;
using cudatest::down;
using cudatest::up;

namespace {

// Rank 0's result of train() on every rank of a world of P rank threads.
cudatest::TrainOnRanks on_thread_ranks(int P) {
  return [P](const Config& cfg, const TrainArgs& args) {
    std::vector<TrainResult> results(static_cast<size_t>(P));
    run_thread_ranks(P, [&](ThreadCommunicator& w) { results[static_cast<size_t>(w.rank())] = train(cfg, args, w); });
    return results[0];
  };
}

// Doubles every element of t `times` times on the calling thread's compute stream: enough queued
// work (16M elements, 12 passes) that a stream not ordered after it would read stale values.
void double_in_place(const Tensor& t, int times) {
  for (int i = 0; i < times; ++i) gpu::scale({t}, 2.0);
}

bool all_equal(const Tensor& device_tensor, double want) {
  const auto v = down(device_tensor).to_doubles();
  return std::all_of(v.begin(), v.end(), [want](double x) { return x == want; });
}

TEST_CASE("thread ranks on one GPU: a stream and an allocator each, ordered after the caller's work",
          "[gpu][threads]") {
  const int64_t n = 16 << 20;
  const Tensor ones = Tensor::from_vector<float>({n}, std::vector<float>(static_cast<size_t>(n), 1.0f));
  for (const int P : {1, 2, 4}) {
    INFO("P = " << P);
    const Tensor shared = up(ones);  // made on slot 0's stream; still being doubled when the ranks start
    double_in_place(shared, 12);
    std::vector<CUstream_st*> streams(static_cast<size_t>(P));
    std::vector<const CachingAllocator*> allocators(static_cast<size_t>(P));
    std::vector<int> saw_shared(static_cast<size_t>(P), 0);
    std::vector<Tensor> made(static_cast<size_t>(P));
    std::vector<double> summed(static_cast<size_t>(P), 0);
    run_thread_ranks(P, [&](ThreadCommunicator& w) {
      const auto r = static_cast<size_t>(w.rank());
      streams[r] = compute_stream(0);
      allocators[r] = &cuda_allocator(0);
      saw_shared[r] = all_equal(shared, 4096.0);  // read on this rank's stream
      made[r] = up(ones);                         // left for the caller, still being doubled at the end
      double_in_place(made[r], 10 + w.rank());
      Tensor x = up(Tensor::from_vector<float>({3}, {float(w.rank() + 1), 1.0f, 0.5f}));
      auto pending = w.all_reduce_sum_async(x);  // on the rank's worker thread, in the rank's slot
      pending->wait();
      summed[r] = down(x).to_doubles()[0];
    });
    CHECK(std::set<CUstream_st*>(streams.begin(), streams.end()).size() == static_cast<size_t>(P));
    CHECK(std::count(streams.begin(), streams.end(), compute_stream(0)) == 0);
    CHECK(std::set<const CachingAllocator*>(allocators.begin(), allocators.end()).size() == static_cast<size_t>(P));
    CHECK(std::count(allocators.begin(), allocators.end(), &cuda_allocator(0)) == 0);
    for (int r = 0; r < P; ++r) {
      INFO("rank " << r);
      CHECK(saw_shared[static_cast<size_t>(r)] == 1);
      CHECK(all_equal(made[static_cast<size_t>(r)], double(1 << (10 + r))));  // read on slot 0's stream
      CHECK(summed[static_cast<size_t>(r)] == double(P * (P + 1) / 2));
    }
  }
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

// Ring attention (sequence_parallel.ring_size, engine/ring.h) on the same ranks: Ulysses 2 × ring 2
// and a pure ring of 4 (the CUDA ring launchers, the K/V blocks copied between rank threads), f32
// and bf16, on a sequence 2P does not divide.
TEST_CASE("thread sp on one GPU: ring attention equals single-process CPU training", "[gpu][sp][threads][ring]") {
  for (const int64_t R : {2, 4})
    for (const std::string arch : {"llama", "gpt2"}) {
      const cudatest::TrainOnRanks ring = [R](const Config& cfg, const TrainArgs& args) {
        Config c = cfg;
        c.sequence_parallel.ring_size = R;
        return on_thread_ranks(4)(c, args);
      };
      cudatest::compare(arch, "float32", 4, 1e-4, 1e-3, ring, true);
      cudatest::compare(arch, "float32", 4, 1e-4, 1e-3, ring, true, 60);  // padded to 64
      cudatest::compare(arch, "bfloat16", 4, 1e-2, 3e-2, ring, true);
    }
}

}  // namespace
