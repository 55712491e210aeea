// Validation (train.eval_every, data.val_path; train/trainer.h) on however many ranks mpirun
// started: under every SP/DP layout the world allows (sp = world, dp = world, and sp 2 × dp 2 on 4
// ranks) the validation loss and accuracy equal the P = 1 run's on the same global batches, and
// the training curve is exactly the one a run without validation makes (evaluation touches no
// parameter, optimizer state or data position). Tolerance as tests/mpi/test_autosp.cpp: 1e-5
// relative (f32, summation order only).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "mpi/mpi_test.h"
#include "train/trainer.h"

namespace autosp::test {
namespace {

using nlohmann::json;

Config config(int64_t sp, int64_t batch_per_rank, int64_t eval_every) {
  return parse_config(
      {{"model", {{"arch", "llama"}, {"vocab_size", 32}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                  {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48}}},
       {"data", {{"source", "synthetic"}, {"seq_len", 32}, {"batch_size", batch_per_rank}}},
       {"train", {{"lr", 1e-2}, {"warmup_steps", 2}, {"eval_every", eval_every}, {"eval_batches", 3}}},
       {"runtime", {{"dtype", "float32"}, {"threads", 1}}},
       {"sequence_parallel", {{"autosp_size", sp}}}});
}

}  // namespace

TEST_CASE("validation: every SP/DP layout gives the P = 1 validation loss; training is unchanged", "[validation]") {
  Communicator& world = test_world();
  const int64_t W = world.size(), global_batch = 4;
  TrainArgs args;
  args.quiet = true;
  auto single = make_single_process_communicator();
  const TrainResult ref = train(with_steps(config(1, global_batch, 3), 6), args, *single);
  REQUIRE(ref.steps.size() == 6);
  REQUIRE(ref.steps[2].evaluated);
  CHECK(!ref.steps[3].evaluated);
  REQUIRE(ref.steps[5].evaluated);
  CHECK(ref.steps[5].val_loss < ref.steps[2].val_loss);  // it is a validation of a model that learns
  CHECK(ref.steps[5].val_accuracy >= 0);

  std::vector<int64_t> sps = {W, 1};
  if (W == 4) sps.push_back(2);
  for (const int64_t sp : sps) {
    const int64_t dp = W / sp;
    INFO("world " << W << ": sp " << sp << " x dp " << dp);
    const TrainResult got = train(with_steps(config(sp, global_batch / dp, 3), 6), args, world);
    const TrainResult plain = train(with_steps(config(sp, global_batch / dp, 0), 6), args, world);
    REQUIRE(got.steps.size() == 6);
    REQUIRE(plain.steps.size() == 6);
    for (size_t k = 0; k < 6; ++k) {
      INFO("step " << k + 1);
      CHECK(got.steps[k].evaluated == ref.steps[k].evaluated);
      CHECK(!plain.steps[k].evaluated);
      CHECK(got.steps[k].loss == plain.steps[k].loss);  // bitwise: evaluation changes nothing
      if (!ref.steps[k].evaluated) continue;
      CHECK(std::abs(got.steps[k].val_loss - ref.steps[k].val_loss) <= 1e-5 * ref.steps[k].val_loss);
      CHECK(std::abs(got.steps[k].val_accuracy - ref.steps[k].val_accuracy) < 1e-12);
    }
    if (world.rank() == 0) CHECK(got.val_example.formatted.find("right") != std::string::npos);
  }
}

}  // namespace autosp::test
