// dpo.precompute_ref's file beside the pair ids (train/dpo_ref_file.h, decision 167): a run writes
// it, a restart reads it (a file with doctored sums moves the step-1 loss from log 2 to the value
// the doctored margin gives, log(1 + e^β), worked out here by hand), a stale one is named by what
// changed and computed again, and garbage or a truncated file is a UsageError naming it.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/loss_mask_files.h"
#include "common/temp_dir.h"
#include "comm/communicator.h"
#include "tensor/safetensors.h"
#include "train/dpo_ref_file.h"
#include "train/trainer.h"

using namespace autosp;
namespace fs = std::filesystem;

namespace {

test::Bytes npy_i32(const std::vector<int32_t>& ids) {
  test::Bytes data;
  for (int32_t v : ids)
    for (int k = 0; k < 4; ++k) data.push_back(static_cast<unsigned char>(static_cast<uint32_t>(v) >> (8 * k)));
  return test::npy("<i4", "(" + std::to_string(ids.size()) + ",)", data);
}

// Four windows of 16 tokens, each one pair: chosen then rejected, 8 tokens each (a 3-token prompt,
// a 5-token completion), as scripts/prepare_data.py --preference lays them out; one pad token.
void write_pairs(const test::TempDir& dir) {
  std::vector<int64_t> tokens, mask;
  std::vector<int32_t> pairs;
  for (int w = 0; w < 4; ++w)
    for (int side = 0; side < 2; ++side)
      for (int t = 0; t < 8; ++t) {
        tokens.push_back(1 + (w * 7 + side * 13 + t * 5) % 60);
        mask.push_back(t >= 3);
        pairs.push_back(side == 0 ? w + 1 : -(w + 1));
      }
  tokens.push_back(0), mask.push_back(0), pairs.push_back(0);
  test::write_shard(dir.path("train_000000.bin"), tokens);
  test::write_bytes(dir.path("train_000000.npy"), test::npy_mask(mask));
  test::write_bytes(dir.path("pairs_train_000000.npy"), npy_i32(pairs));
}

nlohmann::json dpo_json(const test::TempDir& dir, int64_t seed) {
  return nlohmann::json({{"model", {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 16}, {"num_hidden_layers", 1},
                                  {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"intermediate_size", 32},
                                  {"max_position_embeddings", 32}}},
                       {"data", {{"source", "tokens"}, {"path", dir.path("train_*.bin")},
                                 {"loss_mask_path", dir.path("train_*.npy")},
                                 {"pairs_path", dir.path("pairs_train_*.npy")}, {"seq_len", 16}, {"batch_size", 4}}},
                       {"train", {{"steps", 1}, {"objective", "dpo"}, {"seed", seed}}},
                       {"dpo", {{"beta", 0.1}, {"precompute_ref", true}}},
                       {"runtime", {{"dtype", "float64"}, {"threads", 1}}}});
}

Config dpo_config(const test::TempDir& dir, int64_t seed) { return parse_config(dpo_json(dir, seed)); }

StepRecord step1(const Config& cfg) {
  auto world = make_single_process_communicator();
  TrainArgs args;
  args.quiet = true;
  return train(cfg, args, *world).steps.at(0);
}

double step1_loss(const Config& cfg) { return step1(cfg).loss; }

}  // namespace

TEST_CASE("dpo.precompute_ref's file: written, read on a restart, recomputed when stale", "[trainer][dpo]") {
  const test::TempDir dir("dpo-ref-file");
  write_pairs(dir);
  const std::string file = dir.path("ref_logps_train.safetensors");
  CHECK(ref_logps_path(dir.path("pairs_train_*.npy")) == file);

  // The first run computes the sums and stores them; at step 1 the policy is the reference: log 2.
  CHECK(std::abs(step1_loss(dpo_config(dir, 1)) - std::log(2.0)) < 1e-12);
  REQUIRE(fs::exists(file));
  const SafetensorsFile stored = load_safetensors(file);
  CHECK(stored.tensors.at("pair_ids").to_doubles() == std::vector<double>{1, 2, 3, 4});
  CHECK(stored.metadata.at("seq_len") == "16");
  CHECK(stored.metadata.at("dtype") == "f64");

  // A restart reads them: every chosen sum raised by 1 makes z = −1 for every pair, so the loss is
  // −log σ(−β) = log(1 + e^β), which only a run that read the file gets.
  Tensor logps = stored.tensors.at("logps").contiguous();
  for (int64_t n = 0; n < 4; ++n) logps.data<double>()[2 * n] += 1;
  save_safetensors(file, {{"pair_ids", stored.tensors.at("pair_ids")}, {"logps", logps}}, stored.metadata);
  CHECK(std::abs(step1_loss(dpo_config(dir, 1)) - std::log1p(std::exp(0.1))) < 1e-12);

  // Other weights (another seed's initialisation): stale, computed again and written over it.
  CHECK(std::abs(step1_loss(dpo_config(dir, 2)) - std::log(2.0)) < 1e-12);
  const SafetensorsFile again = load_safetensors(file);
  CHECK(again.metadata.at("weights") != stored.metadata.at("weights"));
  CHECK(again.metadata.at("data") == stored.metadata.at("data"));

  // Garbage and a truncated file: a UsageError that names the file, not a recomputation.
  const auto bytes = fs::file_size(file);
  fs::resize_file(file, bytes / 2);
  CHECK_THROWS_WITH(step1_loss(dpo_config(dir, 2)), Catch::Contains(file));
  test::write_bytes(file, {'n', 'o', 't', ' ', 'a', ' ', 'f', 'i', 'l', 'e', 0, 0, 0, 0, 0, 0});
  CHECK_THROWS_AS(step1_loss(dpo_config(dir, 2)), UsageError);
  CHECK_THROWS_WITH(step1_loss(dpo_config(dir, 2)), Catch::StartsWith(file));
}

TEST_CASE("DPO validation: the loss and TRL's eval_ metrics; with dpo.precompute_ref the split's own file",
          "[trainer][dpo]") {
  // The validation split is a copy of the training one, and lr is 0: the policy that validates is
  // the reference, so the loss is log 2 and every reward 0, while the log-probabilities are the
  // training step's own (its logps/ metrics). tests/ref/hf_dpo.py checks the values against TRL.
  const test::TempDir dir("dpo-val");
  write_pairs(dir);
  for (const char* f : {"000000.bin", "000000.npy"}) fs::copy_file(dir.path(std::string("train_") + f), dir.path(std::string("val_") + f));
  fs::copy_file(dir.path("pairs_train_000000.npy"), dir.path("pairs_val_000000.npy"));
  for (const bool precompute : {false, true}) {
    nlohmann::json j = dpo_json(dir, 1);
    j.merge_patch({{"data", {{"val_path", dir.path("val_*.bin")}, {"val_loss_mask_path", dir.path("val_*.npy")},
                             {"val_pairs_path", dir.path("pairs_val_*.npy")}}},
                   {"train", {{"lr", 0}, {"min_lr", 0}, {"eval_every", 1}, {"eval_batches", 2}}},
                   {"dpo", {{"precompute_ref", precompute}}}});
    const StepRecord rec = step1(parse_config(j));
    REQUIRE(rec.evaluated);
    CHECK(std::abs(rec.val_loss - std::log(2.0)) < 1e-12);
    CHECK(rec.val_accuracy == -1);
    std::map<std::string, double> train, val;
    for (const auto& [name, v] : rec.objective_metrics) train[name] = v;
    for (const auto& [name, v] : rec.val_objective_metrics) val[name] = v;
    REQUIRE(val.size() == 6);
    for (const char* reward : {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"})
      CHECK(std::abs(val.at(std::string("eval_") + reward)) < 1e-12);
    for (const char* logps : {"logps/chosen", "logps/rejected"})
      CHECK(std::abs(val.at(std::string("eval_") + logps) - train.at(logps)) < 1e-12);
    CHECK(fs::exists(dir.path("ref_logps_val.safetensors")) == precompute);
  }
}

TEST_CASE("dpo.precompute_ref's file: each key entry that differs is named; wrong contents are refused",
          "[dpo]") {
  const test::TempDir dir("dpo-ref-key");
  const std::string file = dir.path("ref_logps_val.safetensors");
  CHECK(ref_logps_path(dir.path("pairs_val_*.npy")) == file);
  CHECK(ref_logps_path("pairs.npy") == "ref_logps.safetensors");
  const RefLogpsKey key{{"model", "a"}, {"weights", "b"}, {"data", "c"}, {"seq_len", "16"}, {"dtype", "f32"}};
  std::string why;
  CHECK_FALSE(load_ref_logps(file, key, why).has_value());
  CHECK(why == "none yet");
  const RefLogps table{{1, {-3.5, -4.25}}, {7, {-1, -2}}};
  save_ref_logps(file, key, table);
  REQUIRE(load_ref_logps(file, key, why) == table);
  const std::map<std::string, std::string> says{{"model", "the model's config differs"},
                                                {"weights", "the reference's weights differ"},
                                                {"data", "the data files differ"},
                                                {"seq_len", "data.seq_len differs"},
                                                {"dtype", "runtime.dtype differs"}};
  for (const auto& [entry, text] : says) {
    RefLogpsKey other = key;
    other[entry] = "z";
    CHECK_FALSE(load_ref_logps(file, other, why).has_value());
    CHECK(why.rfind(text, 0) == 0);
  }
  // Contents no run writes: unsorted ids, a positive log-probability, a tensor missing, another format.
  auto refused = [&](const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& meta,
                     const std::string& what) {
    save_safetensors(file, tensors, meta);
    CHECK_THROWS_WITH(load_ref_logps(file, key, why), Catch::StartsWith(file) && Catch::Contains(what));
  };
  std::map<std::string, std::string> meta = key;
  meta["format"] = "autosp-dpo-ref-logps/1";
  const Tensor sums = Tensor::from_vector<double>({2, 2}, {-1, -2, -3, -4});
  refused({{"pair_ids", Tensor::from_vector<int64_t>({2}, {2, 1})}, {"logps", sums}}, meta, "ascending");
  refused({{"pair_ids", Tensor::from_vector<int64_t>({2}, {1, 2})},
           {"logps", Tensor::from_vector<double>({2, 2}, {-1, 2, -3, -4})}},
          meta, "<= 0 expected");
  refused({{"pair_ids", Tensor::from_vector<int64_t>({2}, {1, 2})}}, meta, "lacks the tensor");
  refused({{"pair_ids", Tensor::from_vector<int64_t>({3}, {1, 2, 3})}, {"logps", sums}}, meta, "F64 [N, 2]");
  refused({{"pair_ids", Tensor::from_vector<int64_t>({2}, {1, 2})}, {"logps", sums}}, key, "not a file of format");
}
