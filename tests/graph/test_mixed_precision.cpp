// bf16 mixed precision (runtime.dtype "bfloat16"): the pass's golden IR and dtype contract, tiny
// GPT-2 and Llama forward+backward in bf16 (CPU emulation) against the same model in f32, a
// 20-step bf16 training run that tracks the f32 one, and f32 checkpoints from a bf16 run.
//
// Tolerances. bf16 keeps 8 significant bits: each rounding errs by at most 2^-8 ≈ 3.9e-3 relative.
// The loss is a mean of f32 cross-entropies of bf16 logits, so its error stays near one rounding of
// the logits: |Δloss| / loss ≤ 1e-2. A parameter gradient is the end of a chain of bf16 values
// (forward activations, then backward gradients, each rounded once per op) whose errors are
// independent enough to add in quadrature; through two layers and back that is some tens of
// roundings, so a relative L2 error (‖g_bf16 − g_f32‖ / ‖g_f32‖) of a few 2^-8 is expected and
// 3e-2 (≈ 8 roundings' worth) is the bound. An elementwise bound would be meaningless for entries
// near zero. The f32 run is the reference (it is itself checked against PyTorch in test_trainer).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <random>

#include "common/temp_dir.h"
#include "common/tiny_models.h"
#include "common/golden.h"
#include "graph/printer.h"
#include "models/model.h"
#include "train/checkpoint.h"
#include "engine/executor.h"
#include "compiler/program.h"
#include "train/trainer.h"
#include "tensor/safetensors.h"

using namespace autosp;
using autosp::testing::check_golden;
namespace fs = std::filesystem;

namespace {

Config tiny(const std::string& arch, int64_t layers = 1) {
  nlohmann::json model = testing::tiny_model(arch, 32, layers, 48);
  return parse_config({{"model", model}, {"data", {{"seq_len", 24}, {"batch_size", 2}}}});
}

struct LossAndGrads {
  double loss = 0;
  std::map<std::string, Tensor> grads;
};

LossAndGrads run(const Config& cfg, DType dt, const TensorMap& data, const ParamMap& params) {
  RankProgram prog = build_program(cfg, dt, Stage::joint);
  TensorMap feeds = data;
  for (const auto& [name, p] : params) feeds[name] = p;
  RunResult r = Executor(*prog.graph).run(feeds);
  LossAndGrads out;
  out.loss = r.outputs.at(prog.loss).to_doubles().at(0);
  for (size_t i = 0; i < prog.param_names.size(); ++i) out.grads[prog.param_names[i]] = r.outputs.at(prog.grad_names[i]);
  return out;
}

}  // namespace

TEST_CASE("the mixed-precision pass matches its golden IR (GPT-2)", "[bf16][golden]") {
  check_golden("mixed-precision/gpt2-1layer.txt",
               to_text(*build_program(tiny("gpt2"), DType::bf16, Stage::forward).graph));
}

TEST_CASE("bf16 graphs: f32 parameters cast once, bf16 activations, the loss path and gradients in f32", "[bf16]") {
  for (const char* arch : {"gpt2", "llama"}) {
    DYNAMIC_SECTION(arch) {
      const Config cfg = tiny(arch);
      RankProgram p = build_program(cfg, DType::bf16, Stage::joint);
      const Graph& g = *p.graph;
      for (Node* param : g.with_role(Role::parameter)) {
        INFO(param->name());
        CHECK(param->dtype() == DType::f32);
        // Its forward user is one cast to bf16 (the backward may read the parameter no more).
        REQUIRE(param->users().size() == 1);
        CHECK(param->users()[0]->op() == Op::cast);
        CHECK(param->users()[0]->dtype() == DType::bf16);
      }
      for (const char* name : {"loss_sum", "valid_tokens", "loss"}) CHECK(g.find(name)->dtype() == DType::f32);
      CHECK(g.find("logits")->dtype() == DType::bf16);
      for (const auto& n : g.nodes())
        if (n->op() == Op::sdpa) CHECK(extra_types(*n).at(0).dtype == DType::f32);  // lse
      for (Node* grad : g.with_role(Role::gradient)) {
        INFO(grad->name());
        CHECK(grad->dtype() == DType::f32);
      }
      // Sequence parallel on top: bf16 all-to-alls, f32 all-reduces of the loss and its count.
      Config sp = cfg;
      sp.sequence_parallel.autosp_size = 2;
      RankProgram q = build_program(sp, DType::bf16, Stage::joint,
                                    rank_layout(2, 1, sp.sequence_parallel.autosp_size));
      int a2a = 0, ar = 0;
      for (const auto& n : q.graph->nodes()) {
        if (n->op() == Op::all_to_all) a2a += n->dtype() == DType::bf16 ? 1 : -1000;
        if (n->op() == Op::all_reduce) ar += n->dtype() == DType::f32 ? 1 : -1000;
      }
      CHECK(a2a == 8);  // q, k, v and the output, forward and backward, one layer
      CHECK(ar == 2);
    }
  }
}

// "llama tiled": the bf16 run with runtime.tiled_mlp (its weights cast by the pass like matmul's)
// against the plain f32 graph.
TEST_CASE("bf16 forward and backward on CPU track f32 (tiny GPT-2 and Llama)", "[bf16][model]") {
  for (const std::string arch : {"gpt2", "llama", "llama tiled"}) {
    DYNAMIC_SECTION(arch) {
      const Config cfg = tiny(arch == "gpt2" ? "gpt2" : "llama", 2);
      Config cfg_bf16 = cfg;
      cfg_bf16.runtime.tiled_mlp = arch == "llama tiled";
      const ParamMap params = init_params(cfg.model, 3, DType::f32);
      const TensorMap data = testing::random_token_batch(2, 24, cfg.model.vocab_size, 9);
      const LossAndGrads f32 = run(cfg, DType::f32, data, params);
      const LossAndGrads bf16 = run(cfg_bf16, DType::bf16, data, params);
      const double loss_err = std::abs(bf16.loss - f32.loss) / f32.loss;
      INFO("loss bf16 " << bf16.loss << " vs f32 " << f32.loss << " (relative " << loss_err << ")");
      CHECK(loss_err < 1e-2);
      REQUIRE(bf16.grads.size() == f32.grads.size());
      double worst = 0, least = INFINITY;
      for (const auto& [name, want] : f32.grads) {
        const Tensor& got = bf16.grads.at(name);
        REQUIRE(got.dtype() == DType::f32);
        REQUIRE(got.shape() == want.shape());
        const double e = testing::rel_l2(got, want);
        INFO("gradient of " << name << ": relative L2 error " << e);
        CHECK(e <= 3e-2);
        worst = std::max(worst, e);
        least = std::min(least, e);
      }
      // The bf16 run really rounds: no gradient comes out as the f32 one.
      INFO("relative L2 errors of the gradients: " << least << " .. " << worst);
      CHECK(least > 1e-4);
      CHECK(bf16.loss != f32.loss);
    }
  }
}

TEST_CASE("20 bf16 training steps track the f32 run; checkpoints hold f32 masters", "[bf16][trainer]") {
  const test::TempDir tmp("bf16");
  const fs::path& dir = tmp.dir;
  auto cfg_for = [&](const std::string& dtype) {
    nlohmann::json j = {{"model", {{"arch", "llama"}, {"vocab_size", 32}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                                   {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48}}},
                        {"data", {{"source", "synthetic"}, {"seq_len", 32}, {"batch_size", 4}}},
                        {"train", {{"steps", 20}, {"lr", 3e-3}, {"warmup_steps", 2}, {"log_every", 100}}},
                        {"runtime", {{"dtype", dtype}, {"threads", 2}}}};
    if (dtype == "bfloat16") j["train"]["checkpoint_dir"] = (dir / "ck").string();
    return parse_config(j);
  };
  auto world = make_single_process_communicator();
  TrainArgs ta;
  ta.quiet = true;
  const TrainResult f32 = train(cfg_for("float32"), ta, *world);
  const TrainResult bf16 = train(cfg_for("bfloat16"), ta, *world);
  REQUIRE(f32.steps.size() == 20);
  REQUIRE(bf16.steps.size() == 20);
  double worst = 0;
  for (size_t i = 0; i < 20; ++i) {
    const double e = std::abs(bf16.steps[i].loss - f32.steps[i].loss) / f32.steps[i].loss;
    INFO("step " << i + 1 << ": loss bf16 " << bf16.steps[i].loss << " vs f32 " << f32.steps[i].loss);
    CHECK(e < 1e-2);
    worst = std::max(worst, e);
  }
  INFO("largest relative loss difference " << worst);
  CHECK(bf16.steps.back().loss < 0.9 * bf16.steps.front().loss);  // it learns
  for (const auto& [name, p] : bf16.params) CHECK(p.dtype() == DType::f32);
  // The checkpoint stores f32 weights and f32 AdamW moments.
  const std::string step20 = (dir / "ck" / "step_00000020").string();
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    for (const auto& [name, t] : load_safetensors(step20 + "/" + file).tensors) {
      INFO(file << " " << name);
      CHECK(t.dtype() == DType::f32);
    }
}
