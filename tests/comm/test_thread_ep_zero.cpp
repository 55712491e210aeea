// Expert parallelism with ZeRO 1, 2 and 3 (decision 185) on thread ranks, through train(): the
// dense parameters' state is sharded over the world and the experts' over their expert-replica
// group (ZeRO-3 gathers an expert there too), and every step's loss and gradient norm and the
// final whole parameters equal the one-process run (E = 1, ZeRO 0) on the same global batch, for
// Mixtral and Qwen2-MoE with E = 2 and 4 under Ulysses, Ulysses × ring, dp × sp and activation
// checkpointing. A
// checkpoint written under EP × ZeRO-3 holds every expert whole, and a run resumed from it
// continues like the uninterrupted one; validation, --dump-grads and LoRA with frozen experts work
// under it too.
#include <catch2/catch.hpp>

#include <filesystem>
#include <vector>

#include "comm/threads.h"
#include "common/ep_case.h"
#include "common/temp_dir.h"
#include "tensor/safetensors.h"
#include "train/checkpoint.h"

namespace autosp::test {
namespace {

namespace fs = std::filesystem;

// Every rank's train() under `l` at ZeRO `stage`.
std::vector<TrainResult> train_ep(const json& model, const EpLayout& l, int64_t stage,
                                  const json& opt = kEpTrainOpt, const TrainArgs& args = quiet_args()) {
  std::vector<TrainResult> got(static_cast<size_t>(l.world));
  run_thread_ranks(l.world, [&](ThreadCommunicator& w) {
    got[static_cast<size_t>(w.rank())] = train(ep_train_config(model, l, stage, opt), args, w);
  });
  return got;
}

}  // namespace

TEST_CASE("thread ep x zero: ZeRO 1, 2, 3 with E = 2 and 4 give the one-process losses, norms and weights",
          "[threads][moe][ep][zero]") {
  const std::vector<EpLayout> layouts{{2, 2, 1, 2}, {4, 2, 1, 2}, {4, 4, 1, 4, true}, {4, 2, 1, 4}, {4, 4, 2, 2}};
  for (const json& model : {kMixtral, kQwen2Moe}) {
    const TrainResult ref = train_one_process(model);
    REQUIRE(ref.steps.size() == 3);
    for (const EpLayout& l : layouts)
      for (int64_t stage = 1; stage <= 3; ++stage) {
        INFO(model_name(model) << ": " << describe(l) << ", ZeRO " << stage);
        const std::vector<TrainResult> got = train_ep(model, l, stage);
        for (const TrainResult& rank : got) check_train_like(rank, ref);
        // 1/W of the moments on every rank (plus the shards' padding): the dense ones sharded over
        // the W ranks, the experts 1/E per rank and that sharded over the W / E replicas.
        for (const TrainResult& rank : got) {
          CHECK(rank.optimizer_state_bytes >= ref.optimizer_state_bytes / size_t(l.world));
          CHECK(rank.optimizer_state_bytes < ref.optimizer_state_bytes / size_t(l.world) + 2048);
        }
      }
  }
}

TEST_CASE("thread ep x zero: a checkpoint under E = 2 and ZeRO 3 is whole, and a resumed run continues exactly",
          "[threads][moe][ep][zero]") {
  const TempDir tmp("ep-zero-resume");
  const json opt = {{"steps", 4},          {"lr", 1e-2},        {"warmup_steps", 1}, {"min_lr", 1e-4},
                    {"checkpoint_every", 2}, {"log_every", 100}, {"checkpoint_dir", (tmp.dir / "ck").string()}};
  const EpLayout l{4, 2, 1, 2};  // dp 2 × sp 2, E 2: the experts sharded over 2 replicas
  const std::vector<TrainResult> full = train_ep(kQwen2Moe, l, 3, opt);
  REQUIRE(fs::exists(tmp.dir / "ck" / "step_00000002" / "meta.json"));

  // Whole: the one-process model's every tensor, the experts too, equal to the run's final weights.
  const TrainResult one = train_one_process(kQwen2Moe, {{"steps", 1}});
  const Config cfg1 = ep_train_config(kQwen2Moe, {1, 1, 1, 1}, 0);
  const Checkpoint last = load_checkpoint((tmp.dir / "ck" / "step_00000004").string(), cfg1, DType::f32);
  CHECK(last.params.size() == one.params.size());
  CHECK(last.optimizer.exp_avg.size() == one.params.size());
  for (const auto& [name, p] : full[0].params) {
    INFO(name);
    CHECK(last.params.count(name) == 1);
    if (last.params.count(name)) CHECK(p.to_doubles() == last.params.at(name).to_doubles());
  }

  // Resumed at step 2 under the same layout and stage: steps 3 and 4 and the weights bit for bit.
  json opt2 = opt;
  opt2["checkpoint_dir"] = (tmp.dir / "ck2").string();
  TrainArgs resume = quiet_args();
  resume.resume = (tmp.dir / "ck" / "step_00000002").string();
  const std::vector<TrainResult> tail = train_ep(kQwen2Moe, l, 3, opt2, resume);
  for (size_t r = 0; r < tail.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(tail[r].steps.size() == 2);
    for (size_t k = 0; k < 2; ++k) {
      CHECK(tail[r].steps[k].loss == full[r].steps[k + 2].loss);
      CHECK(tail[r].steps[k].grad_norm == full[r].steps[k + 2].grad_norm);
    }
    for (const auto& [name, p] : full[r].params) CHECK(p.to_doubles() == tail[r].params.at(name).to_doubles());
  }
}

}  // namespace autosp::test

namespace autosp::test {

// Validation under EP × ZeRO 3: its forward program shards the experts like the training one
// and is fed the same shards; every step's validation loss equals the one-process run's.
TEST_CASE("thread ep x zero: validation at ZeRO 3 gives the one-process validation loss", "[threads][moe][ep][zero]") {
  json opt = kEpTrainOpt;
  opt["eval_every"] = 1;
  const TrainResult ref = train_one_process(kQwen2Moe, opt);
  const std::vector<TrainResult> got = train_ep(kQwen2Moe, {4, 2, 1, 2}, 3, opt);
  REQUIRE(ref.steps.size() == 3);
  for (const TrainResult& rank : got) {
    REQUIRE(rank.steps.size() == 3);
    for (size_t k = 0; k < 3; ++k) {
      INFO("step " << k + 1);
      REQUIRE(ref.steps[k].evaluated);
      CHECK(std::abs(rank.steps[k].val_loss - ref.steps[k].val_loss) < kTol * std::abs(ref.steps[k].val_loss));
    }
  }
}

// Under bf16 ZeRO-3 casts an expert's shard and gathers the bf16 copy over its replica group, and
// sums its gradient in f32 there (regather_parameters): the first step's loss is ZeRO 0's (the same
// bf16 weights), the later ones within bf16's rounding of the sums' order.
TEST_CASE("thread ep x zero: bf16 at ZeRO 3 gives ZeRO 0's losses", "[threads][moe][ep][zero]") {
  std::vector<std::vector<TrainResult>> got(4, std::vector<TrainResult>(4));
  for (int64_t stage : {0, 3})
    run_thread_ranks(4, [&](ThreadCommunicator& w) {
      Config cfg = ep_train_config(kMixtral, {4, 2, 1, 2}, stage);
      cfg.runtime.dtype = DType::bf16;
      got[size_t(stage)][size_t(w.rank())] = train(cfg, quiet_args(), w);
    });
  const TrainResult &z0 = got[0][0], &z3 = got[3][0];
  REQUIRE(z0.steps.size() == 3);
  REQUIRE(z3.steps.size() == 3);
  CHECK(z3.steps[0].loss == Approx(z0.steps[0].loss).epsilon(1e-6));
  for (size_t k = 1; k < 3; ++k) CHECK(z3.steps[k].loss == Approx(z0.steps[k].loss).epsilon(1e-2));
}

// --dump-grads under EP × ZeRO 2 and 3 (each group unsharded over its own communicator, then every
// expert broadcast by its owner): every tensor of the one-process run's first-step gradients.
TEST_CASE("thread ep x zero: --dump-grads at ZeRO 2 and 3 writes the one-process gradients", "[threads][moe][ep][zero]") {
  const TempDir tmp("ep-zero-grads");
  TrainArgs one = quiet_args();
  one.dump_grads = (tmp.dir / "one.safetensors").string();
  auto single = make_single_process_communicator();
  (void)train(ep_train_config(kMixtral, {1, 1, 1, 1}, 0, {{"steps", 1}}), one, *single);
  const SafetensorsFile want = load_safetensors(one.dump_grads);
  for (int64_t stage : {2, 3}) {
    TrainArgs args = quiet_args();
    args.dump_grads = (tmp.dir / ("zero" + std::to_string(stage) + ".safetensors")).string();
    (void)train_ep(kMixtral, {4, 2, 1, 2}, stage, {{"steps", 1}}, args);
    const SafetensorsFile got = load_safetensors(args.dump_grads);
    INFO("ZeRO " << stage);
    CHECK(got.tensors.size() == want.tensors.size());
    for (const auto& [name, t] : want.tensors) {
      INFO(name);
      REQUIRE(got.tensors.count(name) == 1);
      CHECK(rel_err(got.tensors.at(name), t) < kTol);
    }
  }
}

// LoRA on the attention with the experts frozen (train/expert_split.h zero3_shards feeds ZeRO-3
// the frozen experts' shards over their replica group; no expert trains, so the states keep one
// group): dp 2 × sp 2, E 2 at ZeRO 0 and 3 give the one-process losses, norms and adapters, and
// the adapters are all that trains. Each rank's frozen base is rank 0's whole base (its program
// holds only its own experts, so broadcasting its frozen names alone would pair different
// experts across ranks: decision 187).
TEST_CASE("thread ep x zero: LoRA with frozen experts at ZeRO 0 and 3 equals one process", "[threads][moe][ep][zero]") {
  auto with_lora = [](Config cfg) {
    cfg.lora.enabled = true;
    cfg.lora.r = 4;
    cfg.lora.target_modules = {"q_proj", "v_proj"};
    return cfg;
  };
  const EpLayout l{4, 2, 1, 2};
  std::vector<std::vector<TrainResult>> got(4, std::vector<TrainResult>(4));
  auto single = make_single_process_communicator();
  const TrainResult ref = train(with_lora(ep_train_config(kMixtral, {1, 1, 1, 1}, 0)), quiet_args(), *single);
  for (int64_t stage : {0, 3})
    run_thread_ranks(4, [&](ThreadCommunicator& w) {
      got[size_t(stage)][size_t(w.rank())] = train(with_lora(ep_train_config(kMixtral, l, stage)), quiet_args(), w);
    });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(got[0][size_t(r)].params.size() == 2 * 2 * 2);  // the adapters: 2 layers × (q, v) × (A, B)
    check_train_like(got[0][size_t(r)], ref);
    check_train_like(got[3][size_t(r)], ref);
  }
}

}  // namespace autosp::test
