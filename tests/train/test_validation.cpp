// Validation in the trainer (train.eval_every, train.eval_batches, data.val_path): the validation
// loss after a step is the mean over eval_batches of the loss of the trained parameters on the
// validation shard's windows, recomputed here by a plain forward on windows cut from the tokens
// this test wrote (not through the data loader); it is logged to --metrics; it runs every
// eval_every steps and after the last.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/llmc_shard.h"
#include "common/loss_mask_files.h"
#include "common/temp_dir.h"
#include "engine/executor.h"
#include "compiler/program.h"
#include "train/trainer.h"

using namespace autosp;
namespace fs = std::filesystem;

namespace {

// The loss of `params` on validation batch k (sequence b is the window of S + 1 tokens from
// (k·B + b)·S of `val`) by a plain forward, not through the data loader; `masked` tokens (by
// index) are not predicted (their labels -100), as a loss mask's 0 says.
double reference_loss(const Config& cfg, const ParamMap& params, const std::vector<uint16_t>& val, int64_t k,
                      int64_t B, int64_t S, const std::vector<bool>& masked = {}) {
  RankProgram prog = build_program(cfg, DType::f64, Stage::forward);
  Executor ex(*prog.graph);
  std::vector<int64_t> ids, labels, pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      const size_t at = static_cast<size_t>((k * B + b) * S + t);
      ids.push_back(val[at]);
      labels.push_back(at + 1 < masked.size() && masked[at + 1] ? -100 : val[at + 1]);
      pos.push_back(t);
    }
  TensorMap feeds = params;
  feeds["input_ids"] = Tensor::from_vector<int64_t>({B, S}, ids);
  feeds["labels"] = Tensor::from_vector<int64_t>({B, S}, labels);
  feeds["position_ids"] = Tensor::from_vector<int64_t>({B, S}, pos);
  return ex.run(feeds).outputs.at(prog.loss).to_doubles()[0];
}

}  // namespace

TEST_CASE("validation: the loss of the trained parameters on data.val_path, every eval_every steps", "[trainer]") {
  const test::TempDir tmp("validation");
  const fs::path& dir = tmp.dir;
  testing::write_llmc_shard(dir / "train.bin", 3000, 64, 1);
  const std::vector<uint16_t> val = testing::write_llmc_shard(dir / "val.bin", 500, 64, 2);
  const int64_t S = 16, B = 2, batches = 3;
  const Config cfg = parse_config(
      {{"model", {{"arch", "gpt2"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                  {"num_attention_heads", 4}, {"max_position_embeddings", 64}}},
       {"data", {{"source", "tokens"}, {"path", (dir / "train.bin").string()}, {"val_path", (dir / "val.bin").string()},
                 {"seq_len", S}, {"batch_size", B}}},
       {"train", {{"steps", 5}, {"lr", 1e-2}, {"eval_every", 2}, {"eval_batches", batches}}},
       {"runtime", {{"dtype", "float64"}, {"threads", 1}}}});
  TrainArgs args;
  args.quiet = true;
  args.metrics = (dir / "m.jsonl").string();
  auto world = make_single_process_communicator();
  const TrainResult r = train(cfg, args, *world);
  REQUIRE(r.steps.size() == 5);
  for (size_t k = 0; k < 5; ++k) CHECK(r.steps[k].evaluated == (k == 1 || k == 3 || k == 4));  // steps 2, 4, 5

  // The reference: batch k, sequence b is the window of S + 1 tokens from (k·B + b)·S.
  double sum = 0;
  for (int64_t k = 0; k < batches; ++k) sum += reference_loss(cfg, r.params, val, k, B, S);
  const double want = sum / batches;
  INFO("val loss " << r.steps[4].val_loss << " vs reference " << want);
  CHECK(std::abs(r.steps[4].val_loss - want) <= 1e-12 * want);
  CHECK(r.steps[4].val_accuracy >= 0);
  CHECK(r.steps[4].val_accuracy <= 1);

  // --metrics: the evaluated steps carry val_loss and val_accuracy.
  std::ifstream m(args.metrics);
  std::string line;
  int with_val = 0;
  while (std::getline(m, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) {
      ++with_val;
      CHECK(j.contains("val_accuracy"));
      if (j["step"] == 5) CHECK(j["val_loss"].get<double>() == r.steps[4].val_loss);
    }
  }
  CHECK(with_val == 3);
}

TEST_CASE("validation: masks that remove every target report no loss and no accuracy, not nan and 0", "[trainer]") {
  const test::TempDir tmp("validation-masked");
  const fs::path& dir = tmp.dir;
  testing::write_llmc_shard(dir / "train.bin", 3000, 64, 1);
  const std::vector<uint16_t> val = testing::write_llmc_shard(dir / "val.bin", 500, 64, 2);
  const int64_t S = 16, B = 2, batches = 3;
  // Every target masked; then only batch 0's (the tokens it predicts, 1..32): it has no loss and
  // the mean is over batches 1 and 2.
  std::vector<int64_t> none(500, 0), first(500, 1);
  for (size_t i = 1; i <= 32; ++i) first[i] = 0;
  test::write_bytes((dir / "none.npy").string(), test::npy_mask(none));
  test::write_bytes((dir / "first.npy").string(), test::npy_mask(first));
  auto run = [&](const std::string& mask, const std::string& metrics) {
    const Config cfg = parse_config(
        {{"model", {{"arch", "gpt2"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                    {"num_attention_heads", 4}, {"max_position_embeddings", 64}}},
         {"data", {{"source", "tokens"}, {"path", (dir / "train.bin").string()}, {"val_path", (dir / "val.bin").string()},
                   {"val_loss_mask_path", (dir / mask).string()}, {"seq_len", S}, {"batch_size", B}}},
         {"train", {{"steps", 2}, {"lr", 1e-2}, {"eval_every", 2}, {"eval_batches", batches}}},
         {"runtime", {{"dtype", "float64"}, {"threads", 1}}}});
    TrainArgs args;
    args.quiet = true;
    args.metrics = (dir / metrics).string();
    auto world = make_single_process_communicator();
    return std::pair{cfg, train(cfg, args, *world)};
  };

  const auto [cfg, r] = run("none.npy", "none.jsonl");
  REQUIRE(r.steps.size() == 2);
  const StepRecord& v = r.steps[1];
  CHECK(v.evaluated);
  CHECK(v.val_targets == 0);
  CHECK(v.val_tokens == batches * B * S);
  CHECK(std::isnan(v.val_loss));
  CHECK(v.val_accuracy == -1);  // before: nan and 0.0, "val_accuracy": 0.0 beside "val_loss": null
  std::ifstream m(dir / "none.jsonl");
  std::string line, last;
  while (std::getline(m, line)) last = line;
  const auto j = nlohmann::json::parse(last);
  CHECK(j["val_loss"].is_null());
  CHECK(j["val_accuracy"].is_null());
  CHECK(j["val_targets"] == 0);

  const auto [cfg1, r1] = run("first.npy", "first.jsonl");
  const StepRecord& w = r1.steps[1];
  CHECK(w.val_targets == (batches - 1) * B * S);
  const double want = (reference_loss(cfg1, r1.params, val, 1, B, S) + reference_loss(cfg1, r1.params, val, 2, B, S)) / 2;
  INFO("val loss " << w.val_loss << " vs reference " << want);
  CHECK(std::abs(w.val_loss - want) <= 1e-12 * want);
  CHECK(w.val_accuracy >= 0);
}
