// Activation checkpointing: the same gradients bit for bit, recomputation present, and a smaller
// planned peak for a deeper model.
#include <catch2/catch.hpp>

#include "engine/memory_plan.h"
#include "graph/autograd.h"
#include "graph/printer.h"
#include "models/model.h"
#include "engine/executor.h"
#include "compiler/program.h"

using namespace autosp;

namespace {

Config tiny_model(const char* arch) {
  return parse_config(nlohmann::json::parse(std::string(R"({"model": {"arch": ")") + arch + R"(",
    "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "intermediate_size": 128, "max_position_embeddings": 512}, "data": {"seq_len": 256}})"));
}

// One step of `cfg`'s joint program at `dtype` without and with checkpointing, on the same
// parameters and batch: the loss and every gradient must be the same bits. Returns both runs.
std::pair<RunResult, RunResult> same_bits_with_checkpointing(const Config& cfg, DType dtype) {
  RankLayout single;
  RankProgram plain = build_program(cfg, dtype, Stage::joint, single);
  Config ck = cfg;
  ck.runtime.activation_checkpointing = true;
  RankProgram recompute = build_program(ck, dtype, Stage::joint, single);
  CHECK(recompute.graph->size() > plain.graph->size());
  CHECK(to_text(*recompute.graph).find(".re = ") != std::string::npos);

  TensorMap feeds = init_params(cfg.model, 4, DType::f32);
  const int64_t B = 2, S = 256;
  std::vector<int64_t> ids, labels, pos;
  for (int64_t i = 0; i < B * S; ++i) {
    ids.push_back((i * 11 + 5) % 64);
    labels.push_back((i * 3 + 2) % 64);
    pos.push_back(i % S);
  }
  feeds["input_ids"] = Tensor::from_vector({B, S}, ids);
  feeds["labels"] = Tensor::from_vector({B, S}, labels);
  feeds["position_ids"] = Tensor::from_vector({B, S}, pos);
  RunResult a = Executor(*plain.graph).run(feeds);
  RunResult b = Executor(*recompute.graph).run(feeds);
  CHECK(a.outputs.at("loss").to_doubles() == b.outputs.at("loss").to_doubles());
  for (size_t i = 0; i < plain.grad_names.size(); ++i) {
    INFO("gradient of " << plain.param_names[i]);
    CHECK(a.outputs.at(plain.grad_names[i]).to_doubles() == b.outputs.at(recompute.grad_names[i]).to_doubles());
  }
  return {std::move(a), std::move(b)};
}

}  // namespace

TEST_CASE("activation checkpointing keeps the gradients and lowers the planned peak", "[memory][checkpointing]") {
  for (const char* arch : {"llama", "gpt2"}) {
    DYNAMIC_SECTION(arch) {
      const auto [a, b] = same_bits_with_checkpointing(tiny_model(arch), DType::f32);
      INFO("planned peak without " << a.planned_bytes << ", with checkpointing " << b.planned_bytes);
      CHECK(b.planned_bytes < a.planned_bytes * 3 / 4);
    }
  }
}

// In bf16 too: checkpointing turns the residual + norm fusion off, and the fused bf16 norm reads
// the bf16-rounded sum as the unfused one does (decision 270), so nothing moves.
TEST_CASE("activation checkpointing keeps a bf16 program's loss and gradients, bit for bit", "[checkpointing][bf16]") {
  for (const char* arch : {"llama", "gpt2"}) {
    DYNAMIC_SECTION(arch) { same_bits_with_checkpointing(tiny_model(arch), DType::bf16); }
  }
}

TEST_CASE("under checkpointing the embedding and cheap recomputed values are computed again, not kept", "[memory][checkpointing]") {
  // A 2-layer Llama with the tiled MLP: what must be live while the last layer's attention runs
  // backward is its inputs (q, k, v after RoPE), its output, its outputs' gradients and the
  // residual stream's checkpoint and gradient; the token embedding (layer 0's input) is gathered
  // again for layer 0's backward, the norm before q, k, v and o_proj's input are computed again
  // right before their weight gradients.
  Config cfg = parse_config(nlohmann::json::parse(R"({"model": {"arch": "llama", "vocab_size": 256,
    "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
    "intermediate_size": 256, "max_position_embeddings": 65536}, "data": {"seq_len": 256},
    "runtime": {"activation_checkpointing": true, "tiled_mlp": true}})"));
  RankProgram prog = build_program(cfg, DType::f32, Stage::joint);
  const Graph& g = *prog.graph;
  const size_t backward = backward_begin(g);
  const Node* x = g.find("x");
  REQUIRE(x != nullptr);
  for (const Node* u : x->users()) CHECK(g.position(u) < backward);  // nothing in the backward reads it
  const Node* again = g.find("x.re");
  REQUIRE(again != nullptr);
  CHECK(again->op() == Op::embedding);
  CHECK(g.position(again) > backward);
  const Node* norm = g.find("l1.norm1.re2");
  REQUIRE(norm != nullptr);
  CHECK(norm->op() == Op::rmsnorm);
  // The planned peak: per token, C floats for each of the checkpoint, q, the attention output, dq,
  // dO and the residual gradient, C/2 for each of k, v, dk, dv and the backward's workspace
  // (2 chunks: one partial dK, dV over half the keys), plus the 8 heads' log-sum-exp: 8.5 C + 8.
  const int64_t S = 65536, C = 128;
  const MemoryPlan plan = plan_memory(g, {{"B", 1}, {"S", S}});
  INFO("max live " << plan.max_live_bytes << " B, arena " << plan.arena_bytes << " B at S = " << S);
  CHECK(plan.max_live_bytes <= static_cast<size_t>((C * 17 / 2 + 8) * 4 * S));
  CHECK(plan.arena_bytes <= plan.max_live_bytes * 11 / 10);  // best fit wastes under 10 % here
}
