// runtime.tiled_mlp on a tiny Llama: the graph has one swiglu_mlp node per layer inside the layer's
// checkpointing scope and keeps the Hugging Face parameter names; loss and gradients equal the
// untiled graph over more tokens than one chunk of rows (f64, with and without checkpointing); and
// the planned peak with checkpointing drops by at least the [S, I] buffers the untiled MLP
// backward must hold at once. (The PyTorch comparison is in test_model_vs_torch.cpp.)
#include <catch2/catch.hpp>

#include <cmath>

#include "common/tiny_models.h"
#include "engine/executor.h"
#include "engine/memory_plan.h"
#include "compiler/program.h"
#include "kernels/cpu/mlp.h"
#include "models/model.h"

using namespace autosp;
using testing::rel_max;

namespace {

Config tiny_llama(int64_t seq_len, int64_t intermediate, bool tiled, bool checkpointing) {
  nlohmann::json model = testing::tiny_model("llama", 32, 2, intermediate);
  model["max_position_embeddings"] = 1 << 16;
  Config cfg = parse_config({{"model", model}, {"data", {{"seq_len", seq_len}, {"batch_size", 1}}}});
  cfg.runtime.tiled_mlp = tiled;
  cfg.runtime.activation_checkpointing = checkpointing;
  return cfg;
}

}  // namespace

TEST_CASE("tiled_mlp: one swiglu_mlp per layer, in the layer's scope, over the same parameters", "[model][mlp]") {
  const Config plain = tiny_llama(16, 48, false, false), tiled = tiny_llama(16, 48, true, false);
  auto g = build_forward(tiled.model, DType::f32, ForwardMode::train, {.tiled_mlp = true});
  int mlps = 0;
  for (const auto& n : g->nodes()) {
    CHECK(n->op() != Op::silu);
    if (n->op() != Op::swiglu_mlp) continue;
    ++mlps;
    CHECK(n->name() == "l" + std::to_string(mlps - 1) + ".mlp");
  }
  CHECK(mlps == 2);
  std::vector<std::string> a, b;
  auto untiled = build_forward(plain.model, DType::f32);
  for (const Node* p : untiled->with_role(Role::parameter)) a.push_back(p->name());
  for (const Node* p : g->with_role(Role::parameter)) b.push_back(p->name());
  CHECK(a == b);
  ModelConfig gpt2 = plain.model;
  gpt2.arch = Arch::gpt2;
  CHECK_THROWS_WITH(build_forward(gpt2, DType::f32, ForwardMode::train, {.tiled_mlp = true}),
                    Catch::Contains("runtime.tiled_mlp is for Llama"));
}

TEST_CASE("tiled_mlp: loss and gradients equal the untiled graph over more rows than one chunk", "[model][mlp]") {
  const int64_t S = cpu::kMlpChunkRows + 300;  // B = 1: two chunks, the second partial
  for (const bool checkpointing : {false, true}) {
    DYNAMIC_SECTION("activation_checkpointing " << checkpointing) {
      const Config plain = tiny_llama(S, 48, false, checkpointing), tiled = tiny_llama(S, 48, true, checkpointing);
      TensorMap feeds = testing::random_token_batch(1, S, plain.model.vocab_size, 21);
      for (auto& [name, p] : init_params(plain.model, 5, DType::f64)) feeds[name] = p;
      RankProgram a = build_program(plain, DType::f64, Stage::joint);
      RankProgram b = build_program(tiled, DType::f64, Stage::joint);
      REQUIRE(b.graph->find("l1.mlp"));
      const RunResult ra = Executor(*a.graph).run(feeds), rb = Executor(*b.graph).run(feeds);
      CHECK(rel_max(rb.outputs.at(b.loss), ra.outputs.at(a.loss)) < 1e-12);
      REQUIRE(a.param_names == b.param_names);
      for (size_t i = 0; i < a.param_names.size(); ++i) {
        const double e = rel_max(rb.outputs.at(b.grad_names[i]), ra.outputs.at(a.grad_names[i]));
        INFO("gradient of " << a.param_names[i] << ": relative error " << e);
        CHECK(e < 1e-10);
      }
    }
  }
}

// The untiled backward of a recomputed MLP holds gate [S, I] (for silu_backward), up [S, I] (for
// dgate = dh·up·silu'(gate)) and dh [S, I] (the gradient of silu(gate)·up) at once; the tiled op holds
// none of them. So with checkpointing the planned peak must drop by at least 3·S·I floats.
TEST_CASE("tiled_mlp: the planned peak with checkpointing drops by at least three [S, I] buffers", "[model][mlp][memory]") {
  const int64_t S = 8192, I = 256;
  const Bindings at{{"B", 1}, {"S", S}};
  const size_t plain = plan_memory(*build_program(tiny_llama(S, I, false, true), DType::f32, Stage::joint).graph,
                                   at).arena_bytes;
  const size_t tiled = plan_memory(*build_program(tiny_llama(S, I, true, true), DType::f32, Stage::joint).graph,
                                   at).arena_bytes;
  const size_t bound = 3 * size_t(S) * size_t(I) * sizeof(float);
  INFO("planned peak untiled " << plain << " B, tiled " << tiled << " B, at least " << bound << " B less expected");
  REQUIRE(tiled < plain);
  CHECK(plain - tiled >= bound);
}
