// The training loop: AdamW + warmup/cosine + clipping against torch.optim.AdamW over 5 steps
// (tests/ref/train_ref.py), exact resume, a falling loss on the synthetic task, checkpoint checks,
// a batch with no scored position skipped, and the advice a divergence gives.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/env_var.h"
#include "common/llmc_shard.h"
#include "common/temp_dir.h"
#include "models/weights.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "compiler/program.h"
#include "comm/mesh.h"
#include "train/trainer.h"
#include "tensor/safetensors.h"

using namespace autosp;
namespace fs = std::filesystem;

namespace {

double rel(double a, double b) { return std::abs(a - b) / std::max(1e-30, std::abs(b)); }

// A one-layer Llama (vocabulary 32) on the synthetic task's [2, 32] batches, 2 threads, with what a
// test changes merged in (`patch`, a JSON merge patch: its "train", a different "data" source) and
// `overrides` applied.
Config tiny_llama(const std::string& patch, const std::vector<std::string>& overrides = {}) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"arch": "llama", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32},
    "data": {"source": "synthetic", "seq_len": 32, "batch_size": 2},
    "runtime": {"threads": 2}})");
  j.merge_patch(nlohmann::json::parse(patch));
  return parse_config(j, overrides);
}

// The steps of two quiet runs of `cfg`, with the synthetic task's accuracy scored and not, one
// run at a time (a step's peak counts what the process holds: a finished run's parameters too).
struct ScoredUnscored {
  std::vector<StepRecord> scored, unscored;
};
ScoredUnscored run_scored_and_unscored(const Config& cfg) {
  auto world = make_single_process_communicator();
  TrainArgs ta;
  ta.quiet = true;
  ScoredUnscored r;
  r.scored = train(cfg, ta, *world).steps;
  ta.accuracy = false;
  r.unscored = train(cfg, ta, *world).steps;
  return r;
}

}  // namespace

TEST_CASE("5 AdamW steps with warmup and clipping match torch.optim.AdamW", "[trainer][torch]") {
  const std::vector<nlohmann::json> models = {
      {{"arch", "gpt2"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
       {"num_attention_heads", 4}, {"max_position_embeddings", 64}},
      {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
       {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48}}};
  for (const auto& model : models) {
    for (const std::string dtype : {"float64", "float32"}) {
      DYNAMIC_SECTION(model["arch"].get<std::string>() << " " << dtype) {
        const test::TempDir tmp("train-" + model["arch"].get<std::string>() + dtype);
        const fs::path& dir = tmp.dir;
        testing::write_llmc_shard(dir / "shard.bin", 4000, 64, 3);
        // grad_clip 0.5 makes clipping active on some steps; 2 warmup steps then cosine.
        nlohmann::json cj = {{"model", model},
                             {"data", {{"source", "tokens"}, {"path", (dir / "shard.bin").string()}, {"seq_len", 24},
                                       {"batch_size", 2}}},
                             {"train", {{"lr", 3e-3}, {"min_lr", 3e-4}, {"warmup_steps", 2}, {"weight_decay", 0.1},
                                        {"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"grad_clip", 0.5},
                                        {"log_every", 1}}},
                             {"runtime", {{"dtype", dtype}, {"threads", 2}}}};
        std::ofstream(dir / "cfg.json") << cj.dump();
        Config cfg = parse_config(cj);
        const int64_t steps = 5;

        ParamMap init = init_params(cfg.model, 7, DType::f64);
        save_safetensors((dir / "w.safetensors").string(), init);
        auto data = make_data_source(cfg.data, cfg.model.vocab_size, 0);
        std::map<std::string, Tensor> batches;
        for (int64_t k = 0; k < steps; ++k) {
          Batch b = data->get(k, 0, 1);
          batches["input_ids_" + std::to_string(k)] = b.input_ids;
          batches["labels_" + std::to_string(k)] = b.labels;
          batches["position_ids_" + std::to_string(k)] = b.position_ids;
        }
        save_safetensors((dir / "batches.safetensors").string(), batches);
        const std::string cmd = "OMP_NUM_THREADS=2 /usr/bin/python3 " + std::string(AUTOSP_SOURCE_DIR) +
                                "/tests/ref/train_ref.py --config " + (dir / "cfg.json").string() + " --weights " +
                                (dir / "w.safetensors").string() + " --batches " +
                                (dir / "batches.safetensors").string() + " --steps " + std::to_string(steps) + " --dtype " + dtype + " --out " +
                                (dir / "ref.safetensors").string();
        REQUIRE(std::system(cmd.c_str()) == 0);
        SafetensorsFile ref = load_safetensors((dir / "ref.safetensors").string());

        auto world = make_single_process_communicator();
        TrainArgs ta;
        ta.init_from = (dir / "w.safetensors").string();
        ta.quiet = true;
        TrainResult r = train(with_steps(cfg, steps), ta, *world);
        REQUIRE(r.steps.size() == steps);
        const auto losses = ref.tensors.at("losses").to_doubles();
        const auto norms = ref.tensors.at("grad_norms").to_doubles();
        const auto lrs = ref.tensors.at("lrs").to_doubles();
        const double tol = dtype == "float64" ? 1e-9 : 1e-4;
        int clipped = 0;
        for (int64_t k = 0; k < steps; ++k) {
          INFO("step " << k << " loss " << r.steps[k].loss << " vs " << losses[k] << ", norm " << r.steps[k].grad_norm
                       << " vs " << norms[k]);
          CHECK(rel(r.steps[k].loss, losses[k]) < tol);
          CHECK(rel(r.steps[k].grad_norm, norms[k]) < tol);
          CHECK(rel(r.steps[k].lr, lrs[k]) < 1e-12);
          clipped += norms[k] > 0.5;
        }
        CHECK(clipped > 0);  // the clipping path was exercised
        // Final weights: in f64 only. In f32, parameters whose exact gradient is zero (the key bias:
        // softmax ignores a constant shift of the scores) get float-noise gradients that Adam's
        // normalisation turns into lr-sized steps, so they differ between any two f32 programs.
        if (dtype == "float32") continue;
        for (const auto& [name, p] : r.params) {
          INFO("final " << name);
          auto got = p.to_doubles(), want = ref.tensors.at("final." + name).to_doubles();
          double err = 0, scale = 1e-30;
          for (size_t i = 0; i < got.size(); ++i) {
            err = std::max(err, std::abs(got[i] - want[i]));
            scale = std::max(scale, std::abs(want[i]));
          }
          CHECK(err / scale < tol);
        }
      }
    }
  }
}

TEST_CASE("a resumed run continues exactly like the uninterrupted run", "[trainer]") {
  const test::TempDir tmp("train-resume");
  const fs::path& dir = tmp.dir;
  Config cfg = tiny_llama(R"({"train": {"steps": 6, "warmup_steps": 2, "checkpoint_every": 3, "log_every": 100}})",
                          {"train.checkpoint_dir=" + (dir / "ckpt").string()});
  auto world = make_single_process_communicator();
  TrainArgs ta;
  ta.quiet = true;
  TrainResult full = train(cfg, ta, *world);
  REQUIRE(full.steps.size() == 6);
  REQUIRE(fs::exists(dir / "ckpt" / "step_00000003" / "meta.json"));
  REQUIRE(fs::exists(dir / "ckpt" / "step_00000006" / "meta.json"));

  TrainArgs resume = ta;
  resume.resume = (dir / "ckpt" / "step_00000003").string();
  Config cfg2 = cfg;
  cfg2.train.checkpoint_dir = (dir / "ckpt2").string();
  TrainResult tail = train(cfg2, resume, *world);
  REQUIRE(tail.steps.size() == 3);
  for (size_t k = 0; k < 3; ++k) {
    INFO("step " << tail.steps[k].step);
    CHECK(tail.steps[k].step == full.steps[k + 3].step);
    CHECK(tail.steps[k].loss == full.steps[k + 3].loss);  // bit for bit: same kernels, same order
    CHECK(tail.steps[k].grad_norm == full.steps[k + 3].grad_norm);
  }
  for (const auto& [name, p] : full.params) CHECK(p.to_doubles() == tail.params.at(name).to_doubles());

  // The newest checkpoint under a root is picked, and a checkpoint for another model is refused.
  Checkpoint newest = load_checkpoint((dir / "ckpt").string(), cfg, DType::f32);
  CHECK(newest.step == 6);
  Config other = cfg;
  other.resolved["model"]["hidden_size"] = 64;
  CHECK_THROWS_WITH(load_checkpoint((dir / "ckpt").string(), other, DType::f32), Catch::Contains("was written for model"));
}

TEST_CASE("TrainArgs::accuracy off skips the synthetic task's scoring, and nothing else", "[trainer]") {
  // autosp-bench times steps with it off: scoring copies the logits to the host (2 GiB at S = 32k,
  // V = 32000 on a GPU) and must not count as step time.
  const Config cfg = tiny_llama(R"({"train": {"steps": 2, "log_every": 100}})");
  const auto [scored, unscored] = run_scored_and_unscored(cfg);
  REQUIRE(scored.size() == 2);
  REQUIRE(unscored.size() == 2);
  for (size_t k = 0; k < 2; ++k) {
    CHECK(scored[k].accuracy >= 0);
    CHECK(unscored[k].accuracy == -1);
    CHECK(unscored[k].loss == scored[k].loss);
    CHECK(unscored[k].grad_norm == scored[k].grad_norm);
  }
}

TEST_CASE("unless accuracy is scored, the logits die at the loss's backward", "[trainer][memory]") {
  // The trainer reads the logits after a step only to score the synthetic task. Unscored, they
  // are freed once the cross-entropy backward has read them instead of living through the whole
  // backward, so the step's peak, which the layers' backward sets here (activation checkpointing,
  // a small vocabulary), falls by exactly their bytes.
  const Config cfg = parse_config(nlohmann::json::parse(R"({
    "model": {"arch": "llama", "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256},
    "data": {"source": "synthetic", "seq_len": 128, "batch_size": 1},
    "train": {"steps": 1, "log_every": 100},
    "runtime": {"threads": 2, "activation_checkpointing": true}})"));
  const auto [scored, unscored] = run_scored_and_unscored(cfg);
  REQUIRE(scored.size() == 1);
  REQUIRE(unscored.size() == 1);
  const size_t logits_bytes = 1 * 128 * 64 * sizeof(float);
  CHECK(unscored[0].loss == scored[0].loss);
  CHECK(scored[0].peak_bytes - unscored[0].peak_bytes == logits_bytes);
}

TEST_CASE("runtime.profile_ops counts every kernel call by op kind and changes nothing else", "[trainer]") {
  // The calls per op equal the joint graph's nodes of that op (reshape, an output view, included)
  // once per step; the times add up to no more than the steps' wall time; off, there is no profile
  // and the losses are the same.
  nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"arch": "gpt2", "vocab_size": 32, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "max_position_embeddings": 64},
    "data": {"source": "synthetic", "seq_len": 32, "batch_size": 2},
    "train": {"steps": 3, "log_every": 100},
    "runtime": {"threads": 2}})");
  auto world = make_single_process_communicator();
  TrainArgs ta;
  ta.quiet = true;
  const TrainResult plain = train(parse_config(j), ta, *world);
  j["runtime"]["profile_ops"] = true;
  const Config cfg = parse_config(j);
  const TrainResult profiled = train(cfg, ta, *world);
  CHECK(plain.op_profile.by_op.empty());
  REQUIRE(profiled.steps.size() == 3);
  for (size_t k = 0; k < 3; ++k) CHECK(profiled.steps[k].loss == plain.steps[k].loss);
  std::map<std::string, int64_t> nodes;
  const RankProgram prog = build_program(cfg, cfg.runtime.dtype, Stage::joint, rank_layout(1, 0, 1, 1));
  for (const auto& n : prog.graph->nodes())
    if (n->op() != Op::input && n->op() != Op::parameter && n->op() != Op::output) ++nodes[std::string(n->op_name())];
  REQUIRE(nodes.count("matmul") == 1);
  CHECK(profiled.op_profile.by_op.size() == nodes.size());
  double kernels_ms = 0, steps_ms = 0;
  for (const auto& [op, count] : nodes) {
    INFO(op);
    REQUIRE(profiled.op_profile.by_op.count(op) == 1);
    const OpProfile::Entry& e = profiled.op_profile.by_op.at(op);
    CHECK(e.calls == 3 * count);
    CHECK(e.ms >= 0);
    kernels_ms += e.ms;
  }
  for (const StepRecord& s : profiled.steps) steps_ms += s.step_ms;
  CHECK(kernels_ms > 0);
  CHECK(kernels_ms <= steps_ms);
  const std::string table = op_profile_table(profiled.op_profile, 3, steps_ms);
  CHECK(table.find("matmul") != std::string::npos);
  CHECK(table.find("calls") != std::string::npos);
}

TEST_CASE("malformed checkpoints are named errors", "[trainer]") {
  const test::TempDir tmp("train-badckpt");
  const fs::path& dir = tmp.dir;
  Config cfg = parse_config(nlohmann::json::parse(R"({
    "model": {"arch": "gpt2", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "max_position_embeddings": 16}, "data": {"seq_len": 8}})"));
  ParamMap params = init_params(cfg.model, 1, DType::f32);
  AdamW opt;
  opt.init(params);
  const std::string good = save_checkpoint((dir / "root").string(), 4, params, opt, cfg);
  CHECK(load_checkpoint(good, cfg, DType::f32).step == 4);

  auto copy_of_good = [&](const std::string& name) {
    fs::path p = dir / name;
    fs::copy(good, p, fs::copy_options::recursive);
    return p;
  };
  CHECK_THROWS_WITH(load_checkpoint((dir / "missing").string(), cfg, DType::f32), Catch::Contains("no such checkpoint"));
  fs::create_directories(dir / "empty");
  CHECK_THROWS_WITH(load_checkpoint((dir / "empty").string(), cfg, DType::f32), Catch::Contains("holds no checkpoint"));
  fs::path p = copy_of_good("garbled-meta");
  std::ofstream(p / "meta.json", std::ios::trunc) << "{\"format\": 2, \"step\": ";
  CHECK_THROWS_WITH(load_checkpoint(p.string(), cfg, DType::f32), Catch::Contains("not valid JSON"));
  p = copy_of_good("negative-step");
  std::ofstream(p / "meta.json", std::ios::trunc)
      << nlohmann::json({{"format", 2}, {"step", -2}, {"optimizer_step", 0}, {"config", cfg.resolved}}).dump();
  CHECK_THROWS_WITH(load_checkpoint(p.string(), cfg, DType::f32), Catch::Contains("'step'"));
  p = copy_of_good("future-format");
  std::ofstream(p / "meta.json", std::ios::trunc)
      << nlohmann::json({{"format", 9}, {"step", 1}, {"optimizer_step", 1}, {"config", cfg.resolved}}).dump();
  CHECK_THROWS_WITH(load_checkpoint(p.string(), cfg, DType::f32), Catch::Contains("format"));
  p = copy_of_good("truncated-model");
  fs::resize_file(p / "model.safetensors", 100);
  CHECK_THROWS_AS(load_checkpoint(p.string(), cfg, DType::f32), UsageError);
  p = copy_of_good("missing-moments");
  save_safetensors((p / "optimizer.safetensors").string(), {});
  CHECK_THROWS_WITH(load_checkpoint(p.string(), cfg, DType::f32), Catch::Contains("optimizer.safetensors: ") && Catch::Contains("meta.json records"));
  {  // with a matching checksum the content is checked too
    nlohmann::json meta = nlohmann::json::parse(std::ifstream(p / "meta.json"));
    uint64_t size = 0;
    const uint32_t crc = crc32c_file((p / "optimizer.safetensors").string(), &size);
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", crc);
    meta["files"]["optimizer.safetensors"] = {{"bytes", size}, {"crc32c", hex}};
    std::ofstream(p / "meta.json", std::ios::trunc) << meta.dump();
  }
  CHECK_THROWS_WITH(load_checkpoint(p.string(), cfg, DType::f32), Catch::Contains("missing 'exp_avg."));
}

TEST_CASE("the default config's loss falls", "[trainer]") {
  // configs/default.json (what scripts/train.sh runs on 2 ranks), here on one process for 80 steps.
  Config cfg = load_config(std::string(AUTOSP_SOURCE_DIR) + "/configs/default.json",
                           {"sequence_parallel.autosp_size=1", "runtime.threads=2", "train.steps=80"});
  auto world = make_single_process_communicator();
  TrainArgs ta;
  ta.quiet = true;
  TrainResult r = train(cfg, ta, *world);
  REQUIRE(r.steps.size() == 80);
  double first = 0, last = 0;
  for (int k = 0; k < 5; ++k) first += r.steps[k].loss / 5;
  for (int k = 75; k < 80; ++k) last += r.steps[k].loss / 5;
  INFO("mean loss of the first 5 steps " << first << ", of the last 5 " << last);
  CHECK(last < first - 0.5);  // ln(vocab 83) = 4.42 at the start
}

TEST_CASE("a batch with no scored position is skipped without an update, not called a divergence", "[trainer]") {
  // Every token is the EOS (id 0) and attention stays inside documents: every target is an EOS's,
  // ignored, so the token-mean loss is 0/0.
  const test::TempDir tmp("train-unscored");
  const fs::path& dir = tmp.dir;
  testing::write_llmc_shard(dir / "eos.bin", 2000, 1, 3);
  Config cfg = tiny_llama(R"({"data": {"source": "tokens", "eos_token_id": 0, "document_mask": true},
                             "train": {"steps": 3, "warmup_steps": 1, "log_every": 100}})",
                          {"data.path=" + (dir / "eos.bin").string()});
  auto world = make_single_process_communicator();
  TrainArgs ta;
  ta.quiet = true;
  const ParamMap start = init_params(cfg.model, static_cast<uint64_t>(cfg.train.seed), DType::f32);
  TrainResult r = train(cfg, ta, *world);  // before: "loss nan ... not finite" (RuntimeFailure)
  REQUIRE(r.steps.size() == 3);
  for (const StepRecord& s : r.steps) {
    CHECK(s.skipped);
    CHECK(std::isnan(s.loss));
    // No work, no throughput (before: tokens/s and TFLOP/s of a step that ran nothing); what it
    // read still counts.
    CHECK(std::isnan(s.tokens_per_sec));
    CHECK(std::isnan(s.tflops));
    CHECK(s.mfu == -1);
    CHECK(s.tokens == 2 * 32);
  }
  for (const auto& [name, p] : start) CHECK(p.to_doubles() == r.params.at(name).to_doubles());
}

TEST_CASE("a divergence's advice names a checkpoint from before the parameters that gave it", "[trainer]") {
  const test::TempDir tmp("train-diverged");
  const fs::path& dir = tmp.dir;
  Config cfg = tiny_llama(R"({"train": {"steps": 6, "warmup_steps": 1, "checkpoint_every": 1, "log_every": 100}})",
                          {"train.checkpoint_dir=" + (dir / "ck").string()});
  auto world = make_single_process_communicator();
  TrainArgs ta;
  ta.quiet = true;
  // Step 4's gradients NaN on the only rank (the hook reaches every mode's gradients, one rank too).
  const testing::EnvVar fault("AUTOSP_FAULT", "rank:0,step:4,kind:nan");
  try {
    (void)train(cfg, ta, *world);
    FAIL("the NaN gradients did not stop the run");
  } catch (const RuntimeFailure& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK_THAT(what, Catch::StartsWith("step 4: loss"));
    CHECK_THAT(what, Catch::Contains("gradient norm nan is not finite"));
    // step_3 holds the parameters that gave the NaN; step_2 predates them.
    CHECK_THAT(what, Catch::EndsWith("--resume " + (dir / "ck").string() + "/step_00000002)"));
  }
  CHECK(fs::exists(dir / "ck" / "step_00000003" / "meta.json"));
  CHECK_FALSE(fs::exists(dir / "ck" / "step_00000004"));
}
