// runtime.moe_keep_projections (graph/passes/keep_moe_projections): which programs keep the
// experts' gate and up projections (CPU training programs in f32 and f64; not forward-only
// programs, bf16, CUDA, the expert-parallel op, or with the switch off), the graph it makes (the
// forward's extra output handed to the backward as its last input), and that keeping changes no
// number: the loss and every gradient of Mixtral's and Qwen2-MoE's training programs are the same
// bits as recomputing, in f32 and f64; a non-boolean value is a config error.
#include <catch2/catch.hpp>

#include "common/ep_case.h"
#include "compiler/program.h"
#include "config/config.h"
#include "graph/ops.h"

using namespace autosp;
using namespace autosp::test;

namespace {

// The moe_experts nodes of a program and how many of them keep.
struct Keeping {
  int experts = 0, keeping = 0, backwards_with_block = 0;
};
Keeping keeping(const Graph& g) {
  Keeping k;
  for (const auto& n : g.nodes()) {
    if (n->op() == Op::moe_experts) {
      ++k.experts;
      k.keeping += moe_keeps(*n);
    }
    if (n->op() == Op::moe_experts_backward && moe_keeps(*n)) {
      const Node* last = n->inputs().back();  // the forward's extra output 1
      const bool block = last->op() == Op::output && last->attrs().i("index") == 1 &&
                         last->input(0)->op() == Op::moe_experts && moe_keeps(*last->input(0));
      k.backwards_with_block += block;
    }
  }
  return k;
}

Config mixtral(DType dt = DType::f32) {
  Config cfg = make_config(kMixtral, 1, {{"seq_len", 16}, {"batch_size", 2}});
  cfg.runtime.dtype = dt;
  return cfg;
}

}  // namespace

TEST_CASE("moe_keep_projections keeps the projections in CPU training programs of f32 and f64 only",
          "[models][moe][graph]") {
  // kMixtral: 2 MoE layers.
  Config cfg = mixtral();
  REQUIRE(cfg.runtime.moe_keep_projections);  // the default
  for (const DType dt : {DType::f32, DType::f64}) {
    const Keeping k = keeping(*build_program(cfg, dt, Stage::joint).graph);
    CHECK(k.experts == 2);
    CHECK(k.keeping == 2);
    CHECK(k.backwards_with_block == 2);
  }
  const Node* experts = nullptr;
  const RankProgram p = build_program(cfg, DType::f32, Stage::joint);
  for (const auto& n : p.graph->nodes())
    if (n->op() == Op::moe_experts) experts = n.get();
  REQUIRE(experts);
  // [2, k·B·S, I] with k = 2, I = 24
  REQUIRE(extra_types(*experts).size() == 1);
  CHECK(extra_types(*experts)[0].str() == "f32[2, 2*B*S, 24]");
  // Not a forward-only program (validation, the DPO reference), not bf16, not CUDA, not switched off.
  CHECK(keeping(*build_program(cfg, DType::f32, Stage::rank_forward).graph).keeping == 0);
  CHECK(keeping(*build_program(cfg, DType::bf16, Stage::joint).graph).keeping == 0);
  Config cuda = cfg;
  cuda.runtime.device = DeviceKind::cuda;
  CHECK(keeping(*build_program(cuda, DType::f32, Stage::joint).graph).keeping == 0);
  Config off = cfg;
  off.runtime.moe_keep_projections = false;
  const Keeping none = keeping(*build_program(off, DType::f32, Stage::joint).graph);
  CHECK(none.experts == 2);
  CHECK(none.keeping == 0);
  // Expert parallelism (E = 2 over 2 ranks): its op recomputes.
  Config ep = ep_train_config(kMixtral, {2, 2, 1, 2}, 0);
  int ep_nodes = 0;
  const RankProgram ep_program = build_program(ep, DType::f32, Stage::joint, rank_layout(2, 0, 2));
  for (const auto& n : ep_program.graph->nodes()) {
    ep_nodes += n->op() == Op::moe_experts_ep;
    CHECK(!(n->op() == Op::moe_experts && moe_keeps(*n)));
  }
  CHECK(ep_nodes == 2);
  // A value that is not a boolean is a config error naming the key.
  const auto bad = [](nlohmann::json v) {
    return parse_config({{"model", kMixtral}, {"runtime", {{"moe_keep_projections", v}}}});
  };
  CHECK_THROWS_WITH(bad("yes"), Catch::Contains("runtime.moe_keep_projections"));
  CHECK_THROWS_WITH(bad(1), Catch::Contains("runtime.moe_keep_projections"));
  CHECK_NOTHROW(bad(false));
}

TEST_CASE("keeping the experts' projections changes no bit of the loss or the gradients", "[models][moe]") {
  for (const nlohmann::json* model : {&kMixtral, &kQwen2Moe}) {
    for (const DType dt : {DType::f32, DType::f64}) {
      INFO(model->at("arch").get<std::string>() << " " << dtype_name(dt));
      Config keep = make_config(*model, 1, {{"seq_len", 16}, {"batch_size", 2}});
      Config recompute = keep;
      recompute.runtime.moe_keep_projections = false;
      const ParamMap params = init_params(keep.model, 23, dt);
      const Batch batch = random_batch(2, 16, keep.model.vocab_size, 5);
      REQUIRE(keeping(*build_program(keep, dt, Stage::joint).graph).keeping == 2);
      const LossAndGrads a = run_reference(keep, batch, params, dt), b = run_reference(recompute, batch, params, dt);
      CHECK(a.loss == b.loss);
      REQUIRE(a.grads.size() == b.grads.size());
      for (const auto& [name, g] : b.grads) {
        INFO(name);
        CHECK(a.grads.at(name).to_doubles() == g.to_doubles());
      }
    }
  }
}
