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
#include "common/temp_dir.h"
#include "engine/executor.h"
#include "compiler/program.h"
#include "train/trainer.h"

using namespace autosp;
namespace fs = std::filesystem;

namespace {


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
  RankProgram prog = build_program(cfg, DType::f64, Stage::forward);
  Executor ex(*prog.graph);
  double sum = 0;
  for (int64_t k = 0; k < batches; ++k) {
    std::vector<int64_t> ids, labels, pos;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < S; ++t) {
        const size_t at = static_cast<size_t>((k * B + b) * S + t);
        ids.push_back(val[at]);
        labels.push_back(val[at + 1]);
        pos.push_back(t);
      }
    TensorMap feeds = r.params;
    feeds["input_ids"] = Tensor::from_vector<int64_t>({B, S}, ids);
    feeds["labels"] = Tensor::from_vector<int64_t>({B, S}, labels);
    feeds["position_ids"] = Tensor::from_vector<int64_t>({B, S}, pos);
    sum += ex.run(feeds).outputs.at(prog.loss).to_doubles()[0];
  }
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
