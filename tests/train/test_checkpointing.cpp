// Activation checkpointing: the same gradients bit for bit, recomputation present, and a smaller
// planned peak for a deeper model.
#include <catch2/catch.hpp>

#include "graph/printer.h"
#include "models/model.h"
#include "engine/executor.h"
#include "engine/program.h"

using namespace autosp;

TEST_CASE("activation checkpointing keeps the gradients and lowers the planned peak", "[memory][checkpointing]") {
  for (const char* arch : {"llama", "gpt2"}) {
    DYNAMIC_SECTION(arch) {
      Config cfg = parse_config(nlohmann::json::parse(std::string(R"({"model": {"arch": ")") + arch + R"(",
        "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "intermediate_size": 128, "max_position_embeddings": 512}, "data": {"seq_len": 256}})"));
      PassContext single;
      RankProgram plain = build_program(cfg, DType::f32, Stage::joint, single);
      Config ck = cfg;
      ck.runtime.activation_checkpointing = true;
      RankProgram recompute = build_program(ck, DType::f32, Stage::joint, single);
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
      INFO("planned peak without " << a.planned_bytes << ", with checkpointing " << b.planned_bytes);
      CHECK(b.planned_bytes < a.planned_bytes * 3 / 4);
    }
  }
}
