// Gradient accumulation (train.gradient_accumulation_steps, train/accumulation.h) against one large
// batch, in float64: a step of k micro-batches through train() on P thread ranks gives the loss and
// the gradients (--dump-grads) of the P = 1 program run once on the whole global batch (the k·micro
// sequences of every dp group, read as one step of that batch), at P = 1, 2 and 4, sp alone, dp
// alone and dp × sp, every ZeRO stage, packed documents (text with newline-separated documents
// under data.document_mask, so masked targets fall in every micro-batch and shard), a sequence
// length the SP degree does not divide, and a micro-batch with no scored target at all. Also the
// micro-batch views, and a batch with no target anywhere skipped without running.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "comm/threads.h"
#include "common/sp_case.h"
#include "common/temp_dir.h"
#include "tensor/safetensors.h"
#include "train/accumulation.h"

namespace autosp::test {
namespace {

namespace fs = std::filesystem;

// 40 newlines (the EOS: whole windows with no scored target, so the first micro-batch of the first
// dp group scores nothing), then lowercase words with a newline after every few of them: documents
// of 2 to 42 bytes.
std::string documents_text(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(40, '\n');
  while (s.size() < bytes) {
    const int words = 1 + static_cast<int>(rng() % 6);
    for (int w = 0; w < words; ++w) {
      const int len = 1 + static_cast<int>(rng() % 6);
      for (int c = 0; c < len; ++c) s += static_cast<char>('a' + rng() % 26);
      s += ' ';
    }
    s.back() = '\n';
  }
  return s;
}

struct Case {
  const char* name;
  json model;
  int world, sp, k;
  int64_t micro, seq, stage;
  bool documents = true;
};

// A byte-level model (vocab 256, the text source's) of each family.
const json kLlamaBytes = {{"arch", "llama"}, {"vocab_size", 256}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48}};
const json kGpt2Bytes = {{"arch", "gpt2"}, {"vocab_size", 256}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                         {"num_attention_heads", 4}, {"max_position_embeddings", 64}};

Config case_config(const Case& c, const std::string& text, int64_t batch, int64_t k, int64_t sp) {
  json data = {{"source", "text"}, {"path", text}, {"seq_len", c.seq}, {"batch_size", batch}};
  if (c.documents) data["eos_token_id"] = 10, data["document_mask"] = true;
  return parse_config({{"model", c.model},
                       {"data", data},
                       {"train", {{"gradient_accumulation_steps", k}, {"log_every", 1000}, {"seed", 7}}},
                       {"runtime", {{"dtype", "float64"}, {"threads", 1}, {"grad_bucket_mb", 0.01}}},
                       {"sequence_parallel", {{"autosp_size", sp}}},
                       {"zero_optimization", {{"stage", c.stage}}}});
}

void check_case(const Case& c) {
  INFO(c.name << ": world " << c.world << ", sp " << c.sp << ", k " << c.k << ", micro " << c.micro << ", S "
              << c.seq << ", ZeRO " << c.stage);
  const test::TempDir tmp(std::string("accum-") + c.name);
  const fs::path& dir = tmp.dir;
  const std::string text = (dir / "docs.txt").string();
  std::ofstream(text) << documents_text(4000, 3);
  const int64_t dp = c.world / c.sp;

  // The reference: the P = 1 program once on the global batch, the step's k·micro·dp sequences.
  const Config ref_cfg = case_config(c, text, c.micro * c.k * dp, 1, 1);
  const Batch global = make_data_source(ref_cfg.data, 256, 7)->get(0, 0, 1);
  const ParamMap params = init_params(ref_cfg.model, 7, DType::f64);
  const LossAndGrads want = run_reference(ref_cfg, global, params, DType::f64);

  TrainArgs args;
  args.quiet = true;
  args.dump_grads = (dir / "grads.safetensors").string();
  std::vector<TrainResult> results(static_cast<size_t>(c.world));
  run_thread_ranks(c.world, [&](ThreadCommunicator& w) {
    results[static_cast<size_t>(w.rank())] = train(with_steps(case_config(c, text, c.micro, c.k, c.sp), 1), args, w);
  });
  const StepRecord& rec = results[0].steps.at(0);
  CHECK(std::abs(rec.loss - want.loss) <= 1e-12 * std::abs(want.loss));
  const SafetensorsFile got = load_safetensors(args.dump_grads);
  REQUIRE(got.tensors.size() == want.grads.size());
  for (const auto& [name, g] : want.grads) {
    INFO(name);
    CHECK(rel_err(got.tensors.at(name), g) < 1e-10);
  }
  // The targets the loss was normalised by: the global batch's scored labels.
  int64_t scored = 0;
  for (double l : global.labels.to_doubles()) scored += l != -100;
  CHECK(rec.targets == scored);
  if (c.k > 1) CHECK(results[0].accumulator_bytes > 0);
}

TEST_CASE("accumulation: k micro-batches give one large batch's loss and gradients (float64)", "[accumulation][threads]") {
  const Case cases[] = {
      {"p1", kLlamaBytes, 1, 1, 3, 2, 16, 0},
      {"p1-gpt2", kGpt2Bytes, 1, 1, 2, 1, 24, 0, false},
      {"sp2", kLlamaBytes, 2, 2, 3, 1, 16, 0},
      {"dp2-zero1", kLlamaBytes, 2, 1, 2, 2, 16, 1},
      {"dp2sp2-zero2", kLlamaBytes, 4, 2, 2, 1, 16, 2},
      {"sp4-uneven-zero3", kLlamaBytes, 4, 4, 2, 1, 22, 3},
      {"sp2-zero3-gpt2", kGpt2Bytes, 2, 2, 3, 1, 16, 3},
  };
  for (const Case& c : cases) check_case(c);
}

TEST_CASE("accumulation: micro-batch i is rows [i·B/k, (i+1)·B/k) of the step's batch, as views", "[accumulation]") {
  const Batch b = random_batch(6, 5, 64, 1);
  const std::vector<double> ids = b.input_ids.to_doubles(), labels = b.labels.to_doubles();
  for (int64_t k : {1, 2, 3, 6})
    for (int64_t i = 0; i < k; ++i) {
      const Batch m = micro_batch(b, i, k);
      REQUIRE(m.input_ids.dim(0) == 6 / k);
      const std::vector<double> got = m.input_ids.to_doubles();
      const std::vector<double> want(ids.begin() + i * (6 / k) * 5, ids.begin() + (i + 1) * (6 / k) * 5);
      CHECK(got == want);
      CHECK(m.labels.to_doubles() ==
            std::vector<double>(labels.begin() + i * (6 / k) * 5, labels.begin() + (i + 1) * (6 / k) * 5));
      CHECK(!m.doc_start.defined());
    }
}

TEST_CASE("accumulation: a step with no scored target anywhere runs nothing and updates nothing", "[accumulation]") {
  // Every window of a text of newlines is all EOS: every target is ignored under document_mask.
  const test::TempDir tmp("accum-empty");
  const fs::path& dir = tmp.dir;
  const std::string text = (dir / "eos.txt").string();
  std::ofstream(text) << std::string(400, '\n');
  const Case c{"empty", kLlamaBytes, 1, 1, 2, 1, 16, 0};
  const Config cfg = with_steps(case_config(c, text, 1, 2, 1), 2);
  auto world = make_single_process_communicator();
  TrainArgs args;
  args.quiet = true;
  const TrainResult r = train(cfg, args, *world);
  REQUIRE(r.steps.size() == 2);
  for (const StepRecord& s : r.steps) {
    CHECK(s.skipped);
    CHECK(s.targets == 0);
  }
  const ParamMap start = init_params(cfg.model, 7, DType::f64);
  for (const auto& [name, p] : start) CHECK(r.params.at(name).to_doubles() == p.to_doubles());
}

}  // namespace
}  // namespace autosp::test

namespace autosp::test {
namespace {

// A shuffled text of 7 windows of 16 (126 bytes), so that 6 steps of 4 sequences cross three epochs.
Config resume_config(const std::string& text, const std::string& ckpt, int64_t batch, int64_t k) {
  return parse_config({{"model", kLlamaBytes},
                       {"data", {{"source", "text"}, {"path", text}, {"seq_len", 16}, {"batch_size", batch},
                                 {"shuffle", true}}},
                       {"train", {{"steps", 6}, {"gradient_accumulation_steps", k}, {"checkpoint_dir", ckpt},
                                  {"checkpoint_every", 3}, {"log_every", 100}, {"warmup_steps", 2}, {"seed", 5}}},
                       {"runtime", {{"dtype", "float64"}, {"threads", 1}}}});
}

TEST_CASE("accumulation: a resume continues the data where the run stopped, under another dp, batch or k",
          "[accumulation][checkpoint][threads]") {
  const test::TempDir tmp("accum-resume");
  const fs::path& dir = tmp.dir;
  const std::string text = (dir / "docs.txt").string();
  std::ofstream(text) << documents_text(166, 9).substr(40, 126);  // no leading newlines
  TrainArgs args;
  args.quiet = true;
  auto world = make_single_process_communicator();
  const TrainResult full = train(resume_config(text, (dir / "full").string(), 4, 1), args, *world);
  REQUIRE(full.steps.size() == 6);
  CHECK(full.steps.back().epochs == "epoch 3 (42%)");  // 24 sequences, 7 an epoch: 3 and 3/7, floored
  const std::string step3 = (dir / "full" / "step_00000003").string();

  SECTION("the same run: bit for bit") {
    args.resume = step3;
    const TrainResult tail = train(resume_config(text, (dir / "same").string(), 4, 1), args, *world);
    REQUIRE(tail.steps.size() == 3);
    for (size_t i = 0; i < 3; ++i) CHECK(tail.steps[i].loss == full.steps[i + 3].loss);
  }
  SECTION("2 dp ranks, micro-batch 1, k = 2: the same global batch, the same sequences") {
    args.resume = step3;
    std::vector<TrainResult> tails(2);
    run_thread_ranks(2, [&](ThreadCommunicator& w) {
      tails[static_cast<size_t>(w.rank())] =
          train(resume_config(text, (dir / "dp2").string() + std::to_string(w.rank()), 1, 2), args, w);
    });
    REQUIRE(tails[0].steps.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      INFO("step " << i + 4);
      CHECK(std::abs(tails[0].steps[i].loss - full.steps[i + 3].loss) <= 1e-12 * full.steps[i + 3].loss);
    }
  }
  SECTION("a checkpoint without a recorded position continues at step × global batch") {
    const fs::path meta = fs::path(step3) / "meta.json";
    json m = json::parse(std::ifstream(meta));
    m["data_position"] = 3;  // the older format: the step
    std::ofstream(meta) << m.dump(2);
    args.resume = step3;
    const TrainResult tail = train(resume_config(text, (dir / "old").string(), 4, 1), args, *world);
    REQUIRE(tail.steps.size() == 3);
    for (size_t i = 0; i < 3; ++i) CHECK(tail.steps[i].loss == full.steps[i + 3].loss);
  }
  SECTION("another seq_len under shuffle, mid-epoch, is refused with the reason") {
    args.resume = step3;
    Config other = resume_config(text, (dir / "seq").string(), 4, 1);
    other = parse_config(other.resolved, {"data.seq_len=8"});
    CHECK_THROWS_WITH(train(other, args, *world), Catch::Contains("seq_len"));
  }
}

}  // namespace
}  // namespace autosp::test
