// LoRA under sequence parallelism (graph/passes/lora.h) on however many ranks mpirun started (2
// and 4 under ctest): a GQA Llama with adapters on every projection, random B (init false, so
// every adapter gradient is nonzero from step 1) and the norms trained whole
// (modules_to_save: every norm), in float64, trains 5 steps with the losses and final adapters of one process
// on the same global batch, on every dp × sp mesh, with Ulysses and with ring attention, and at
// every ZeRO stage; the measured optimizer state and gradient buckets are the trained tensors' only.
// With lora_dropout 0.25 the same meshes and rings (ZeRO 0, and ZeRO 3 with activation
// checkpointing) still equal one process, and one process with checkpointing equals one without.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "comm/communicator.h"
#include "mpi/mpi_test.h"
#include "train/trainer.h"

namespace autosp::test {
namespace {

using nlohmann::json;

Config lora_config(int64_t sp, int64_t ring, int64_t stage, int64_t batch, double dropout = 0,
                   bool checkpointing = false) {
  return with_steps(
      parse_config({{"model", {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                               {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48}}},
                    {"data", {{"source", "synthetic"}, {"seq_len", 16}, {"batch_size", batch}}},
                    {"train", {{"lr", 1e-2}, {"warmup_steps", 1}, {"grad_clip", 0.5}, {"log_every", 1000}}},
                    {"runtime", {{"threads", 1}, {"dtype", "float64"}, {"grad_bucket_mb", 0.001},
                                 {"activation_checkpointing", checkpointing}}},
                    {"sequence_parallel", {{"autosp_size", sp}, {"ring_size", ring}}},
                    {"zero_optimization", {{"stage", stage}}},
                    {"lora", {{"r", 4}, {"lora_alpha", 8}, {"target_modules", "all-linear"},
                              {"init_lora_weights", false}, {"modules_to_save", {"norm"}},
                              {"lora_dropout", dropout}}}}),
      5);
}

// The largest relative loss difference over the steps and the largest difference of a trained tensor.
std::pair<double, double> distance(const TrainResult& r, const TrainResult& ref) {
  double loss = 0, weight = 0;
  REQUIRE(r.steps.size() == ref.steps.size());
  for (size_t k = 0; k < r.steps.size(); ++k)
    loss = std::max(loss, std::abs(r.steps[k].loss - ref.steps[k].loss) / std::abs(ref.steps[k].loss));
  REQUIRE(r.params.size() == ref.params.size());
  for (const auto& [name, t] : ref.params) {
    const std::vector<double> x = r.params.at(name).to_doubles(), y = t.to_doubles();
    for (size_t i = 0; i < x.size(); ++i) weight = std::max(weight, std::abs(x[i] - y[i]));
  }
  return {loss, weight};
}

// `r` trained like `ref`, a run of one process: every step's loss and every trained tensor to 1e-12.
void check_like_one_process(const TrainResult& r, const TrainResult& ref) {
  const auto [loss, weight] = distance(r, ref);
  INFO("loss " << loss << ", adapters " << weight);
  CHECK(loss < 1e-12);
  CHECK(weight < 1e-12);
}

// Both tests' runs: quiet and without the synthetic task's accuracy, on the world's ranks or on one
// process.
struct Runs {
  Communicator& world = test_world();
  std::unique_ptr<Communicator> single = make_single_process_communicator();
  TrainArgs args = [] {
    TrainArgs a;
    a.quiet = true;
    a.accuracy = false;
    return a;
  }();
  TrainResult on_world(const Config& cfg) { return train(cfg, args, world); }
  TrainResult alone(const Config& cfg) { return train(cfg, args, *single); }
};

TEST_CASE("lora: every mesh, ring and ZeRO stage trains like one process", "[mpi][lora]") {
  Runs runs;
  const int64_t W = runs.world.size();
  for (int64_t sp = 1; sp <= W; sp *= 2) {
    const int64_t dp = W / sp;
    const TrainResult ref = runs.alone(lora_config(1, 1, 0, 2 * dp));  // the same global batch
    REQUIRE(ref.steps.size() == 5);
    CHECK(std::abs(ref.steps.back().loss - ref.steps.front().loss) > 1e-3);  // the adapters moved the loss
    // The trained tensors: 2 adapters × 7 projections × 2 layers, and every norm (PEFT's "norm").
    CHECK(ref.params.size() == 33);
    CHECK(ref.params.count("model.norm.weight") == 1);
    for (int64_t ring : {int64_t{1}, sp}) {
      if (ring > 1 && sp < 2) continue;
      for (int64_t stage : {0, 1, 2, 3}) {
        const TrainResult r = runs.on_world(lora_config(sp, ring, stage, 2));
        INFO("dp " << dp << " x sp " << sp << ", ring " << ring << ", stage " << stage);
        check_like_one_process(r, ref);
        // What the run held, measured: AdamW moments of the trained tensors only (1/W of them, plus
        // padding, when sharded), and at stage 0 gradient buckets of exactly their bytes.
        size_t trained = 0;
        for (const auto& [name, t] : ref.params) trained += static_cast<size_t>(t.numel()) * 8;
        if (stage == 0) {
          CHECK(r.optimizer_state_bytes == 2 * trained);
          CHECK(r.grad_bucket_bytes == trained);
        } else {
          CHECK(r.optimizer_state_bytes <= 2 * trained / static_cast<size_t>(W) + 2 * 8 * 64 * ref.params.size());
        }
      }
    }
  }
}

// lora_dropout's mask is a function of each token's index in the read order (kernels/kinds.h), so
// P ranks under Ulysses, ring and dp × sp drop exactly what one process drops, and the recompute
// under activation checkpointing draws the same mask as the forward.
TEST_CASE("lora: dropout drops the same elements on every mesh and ring as in one process", "[mpi][lora]") {
  Runs runs;
  const int64_t W = runs.world.size();
  for (int64_t sp = 1; sp <= W; sp *= 2) {
    const int64_t dp = W / sp;
    const TrainResult ref = runs.alone(lora_config(1, 1, 0, 2 * dp, 0.25));
    const TrainResult undropped = runs.alone(lora_config(1, 1, 0, 2 * dp));
    CHECK(distance(ref, undropped).first > 1e-6);  // the dropout changed the run
    check_like_one_process(runs.alone(lora_config(1, 1, 0, 2 * dp, 0.25, true)), ref);  // recomputed
    for (int64_t ring : {int64_t{1}, sp}) {
      if (ring > 1 && sp < 2) continue;
      for (int64_t stage : {0, 3}) {
        const TrainResult r = runs.on_world(lora_config(sp, ring, stage, 2, 0.25, stage == 3));
        INFO("dp " << dp << " x sp " << sp << ", ring " << ring << ", stage " << stage);
        check_like_one_process(r, ref);
      }
    }
  }
}

}  // namespace
}  // namespace autosp::test
