// runtime.tiled_loss on tiny GPT-2 (tied head) and Llama (untied): the graph has no logits, one
// linear_cross_entropy_sum node over the same parameters and a predictions output; loss and
// gradients equal the untiled graph over more tokens than one chunk of rows (f64, with and without
// checkpointing) and the predictions are the untiled logits' argmax; the planned peak with
// checkpointing drops by the [S, V] logits less the one chunk the op keeps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "common/tiny_models.h"
#include "engine/executor.h"
#include "engine/memory_plan.h"
#include "compiler/program.h"
#include "kernels/cpu/loss.h"
#include "models/model.h"

using namespace autosp;
using testing::rel_max;

namespace {

Config tiny(const std::string& arch, int64_t seq_len, int64_t vocab, bool tiled, bool checkpointing) {
  nlohmann::json model = testing::tiny_model(arch, 32, 2, 48);
  model["vocab_size"] = vocab;
  model["max_position_embeddings"] = 1 << 16;
  if (arch == "llama") model["tie_word_embeddings"] = false;
  Config cfg = parse_config({{"model", model}, {"data", {{"seq_len", seq_len}, {"batch_size", 1}}}});
  cfg.runtime.tiled_loss = tiled;
  cfg.runtime.activation_checkpointing = checkpointing;
  return cfg;
}

}  // namespace

TEST_CASE("tiled_loss: no logits, one linear_cross_entropy_sum over the same parameters", "[model][loss]") {
  for (const std::string arch : {"gpt2", "llama"}) {
    INFO(arch);
    const Config plain = tiny(arch, 16, 64, false, false);
    auto g = build_forward(plain.model, DType::f32, ForwardMode::train, {.tiled_loss = true});
    CHECK(g->find("logits") == nullptr);
    CHECK(g->with_role(Role::logits).empty());
    const Node* sum = g->find("loss_sum");
    REQUIRE(sum != nullptr);
    CHECK(sum->op() == Op::linear_cross_entropy_sum);
    CHECK(sum->input(1)->name() == (arch == "gpt2" ? "transformer.wte.weight" : "lm_head.weight"));
    bool predictions = false;
    for (const Node* o : g->outputs()) predictions |= o->name() == "predictions" && o->dtype() == DType::i64;
    CHECK(predictions);
    std::vector<std::string> a, b;
    const auto untiled = build_forward(plain.model, DType::f32);
    for (const Node* p : untiled->with_role(Role::parameter)) a.push_back(p->name());
    for (const Node* p : g->with_role(Role::parameter)) b.push_back(p->name());
    CHECK(a == b);
    // Generation graphs keep their logits.
    CHECK(build_forward(plain.model, DType::f32, ForwardMode::prefill, {.tiled_loss = true})->find("logits"));
  }
}

TEST_CASE("tiled_loss: loss, gradients and predictions equal the untiled graph over several chunks", "[model][loss]") {
  const int64_t V = 1024, chunk = cpu::linear_ce_chunk_rows(1 << 20, V);
  const int64_t S = 2 * chunk + 300;  // B = 1: three chunks, the last partial
  for (const std::string arch : {"gpt2", "llama"}) {
    for (const bool checkpointing : {false, true}) {
      DYNAMIC_SECTION(arch << ", activation_checkpointing " << checkpointing) {
        const Config plain = tiny(arch, S, V, false, checkpointing), tiled = tiny(arch, S, V, true, checkpointing);
        TensorMap feeds = testing::random_token_batch(1, S, V, 21);
        for (auto& [name, p] : init_params(plain.model, 5, DType::f64)) feeds[name] = p;
        RankProgram a = build_program(plain, DType::f64, Stage::joint);
        RankProgram b = build_program(tiled, DType::f64, Stage::joint);
        const RunResult ra = Executor(*a.graph).run(feeds), rb = Executor(*b.graph).run(feeds);
        CHECK(rel_max(rb.outputs.at(b.loss), ra.outputs.at(a.loss)) < 1e-12);
        REQUIRE(a.param_names == b.param_names);
        for (size_t i = 0; i < a.param_names.size(); ++i) {
          const double e = rel_max(rb.outputs.at(b.grad_names[i]), ra.outputs.at(a.grad_names[i]));
          INFO("gradient of " << a.param_names[i] << ": relative error " << e);
          CHECK(e < 1e-10);
        }
        const auto logits = ra.outputs.at("logits").to_doubles();
        const Tensor pred = rb.outputs.at("predictions");
        REQUIRE(pred.numel() == S);
        int64_t wrong = 0;
        for (int64_t t = 0; t < S; ++t) {
          const auto row = logits.begin() + t * V;
          wrong += pred.data<int64_t>()[t] != std::max_element(row, row + V) - row;
        }
        CHECK(wrong == 0);
      }
    }
  }
}

// The untiled graph plans the logits [S, V] (dlogits takes their place at the loss's backward); the
// tiled op plans one chunk of them as its workspace. With checkpointing the planned peak must drop
// by at least the logits less that chunk.
TEST_CASE("tiled_loss: the planned peak with checkpointing drops by the [S, V] logits less one chunk",
          "[model][loss][memory]") {
  const int64_t S = 8192, V = 4096;
  const Bindings at{{"B", 1}, {"S", S}};
  for (const std::string arch : {"gpt2", "llama"}) {
    const size_t plain = plan_memory(*build_program(tiny(arch, S, V, false, true), DType::f32, Stage::joint).graph,
                                     at).arena_bytes;
    const size_t tiled = plan_memory(*build_program(tiny(arch, S, V, true, true), DType::f32, Stage::joint).graph,
                                     at).arena_bytes;
    const size_t bound = size_t(S * V - cpu::linear_ce_scratch_elems(S, V)) * sizeof(float);
    INFO(arch << ": planned peak untiled " << plain << " B, tiled " << tiled << " B, at least " << bound << " B less");
    REQUIRE(tiled < plain);
    CHECK(plain - tiled >= bound);
  }
}
