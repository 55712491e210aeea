// transformers 5's fused expert layout (models/fused_experts.h): a weights file whose experts are
// mlp.experts.gate_up_proj [E, 2I, C] and mlp.experts.down_proj [E, C, I] (and Mixtral's router
// under mlp.gate) loads into exactly the per-expert tensors of the 4.x file it was made from. The
// fused tensors are built here element by element from transformers' conversion mapping (stack the
// experts' gate and up weights, concatenate them on dim 1), not by the code under test; a half-fused
// layer, a misshaped fused tensor and an expert in both layouts are named errors.
#include <catch2/catch.hpp>

#include "common/temp_dir.h"
#include "config/config.h"
#include "models/model.h"
#include "models/moe.h"
#include "models/weights.h"
#include "tensor/safetensors.h"

using namespace autosp;
using json = nlohmann::json;

namespace {

ModelConfig moe_config(const char* arch, json more = json::object()) {
  json m = {{"arch", arch}, {"vocab_size", 32}, {"hidden_size", 8}, {"num_hidden_layers", 2},
            {"num_attention_heads", 2}, {"num_key_value_heads", 2}, {"intermediate_size", 12},
            {"max_position_embeddings", 64}, {"num_experts_per_tok", 2}};
  m.update(more);
  return parse_config({{"model", m}, {"data", {{"seq_len", 8}}}}).model;
}

// `params` with every sparse layer's experts fused as transformers 5 stores them.
ParamMap fuse(const ParamMap& params, const ModelConfig& m) {
  ParamMap out = params;
  const int64_t E = m.num_experts, I = m.expert_width(), C = m.hidden_size;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    if (!m.sparse_layer(l)) continue;
    const std::string layer = str("model.layers.", l, ".");
    std::vector<double> gate_up(static_cast<size_t>(E * 2 * I * C)), down(static_cast<size_t>(E * C * I));
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<double> g = params.at(moe_expert_weight(m, layer, e, 0)).to_doubles();
      const std::vector<double> u = params.at(moe_expert_weight(m, layer, e, 1)).to_doubles();
      const std::vector<double> d = params.at(moe_expert_weight(m, layer, e, 2)).to_doubles();
      for (int64_t r = 0; r < 2 * I; ++r)
        for (int64_t c = 0; c < C; ++c)
          gate_up[static_cast<size_t>((e * 2 * I + r) * C + c)] = r < I ? g[static_cast<size_t>(r * C + c)]
                                                                        : u[static_cast<size_t>((r - I) * C + c)];
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < I; ++i) down[static_cast<size_t>((e * C + c) * I + i)] = d[static_cast<size_t>(c * I + i)];
      for (int which = 0; which < 3; ++which) out.erase(moe_expert_weight(m, layer, e, which));
    }
    out[layer + "mlp.experts.gate_up_proj"] = Tensor::from_vector<double>({E, 2 * I, C}, gate_up);
    out[layer + "mlp.experts.down_proj"] = Tensor::from_vector<double>({E, C, I}, down);
    const std::string router = moe_router_weight(m, layer);
    if (router != layer + "mlp.gate.weight") {  // Mixtral: transformers 5 renames the router
      out[layer + "mlp.gate.weight"] = out.at(router);
      out.erase(router);
    }
  }
  return out;
}

void check_equal(const ParamMap& got, const ParamMap& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(got.at(name).shape() == t.shape());
    CHECK(got.at(name).to_doubles() == t.to_doubles());
  }
}

}  // namespace

TEST_CASE("transformers 5's fused experts load as the per-expert tensors they were made from", "[models][moe]") {
  const test::TempDir tmp("fused-experts");
  const std::string path = (tmp.dir / "model.safetensors").string();
  // Mixtral (every layer sparse, router renamed), Qwen2-MoE with a dense layer and a shared
  // expert, Qwen3-MoE with its own expert width.
  for (const ModelConfig& m :
       {moe_config("mixtral", {{"num_local_experts", 3}}),
        moe_config("qwen2_moe", {{"num_experts", 4}, {"moe_intermediate_size", 6}, {"shared_expert_intermediate_size", 10},
                                 {"mlp_only_layers", {1}}}),
        moe_config("qwen3_moe", {{"num_experts", 4}, {"moe_intermediate_size", 6}})}) {
    INFO(arch_name(m.arch));
    const ParamMap params = init_params(m, 7, DType::f64);
    const ParamMap fused = fuse(params, m);
    CHECK(fused.size() < params.size());
    save_safetensors(path, fused);
    check_equal(load_weights(path, m, DType::f64), params);
    // The float32 file converts like any other.
    ParamMap narrow;
    for (const auto& [name, t] : fused) narrow[name] = t.to(DType::f32);
    save_safetensors(path, narrow);
    const ParamMap loaded = load_weights(path, m, DType::f32);
    for (const auto& [name, t] : params) CHECK(loaded.at(name).to_doubles() == t.to(DType::f32).to_doubles());
  }
}

TEST_CASE("a half-fused, misshaped or doubled expert layout is a named error", "[models][moe]") {
  const test::TempDir tmp("fused-experts-bad");
  const std::string path = (tmp.dir / "model.safetensors").string();
  const ModelConfig m = moe_config("qwen3_moe", {{"num_experts", 4}, {"moe_intermediate_size", 6}, {"num_hidden_layers", 1}});
  const ParamMap params = init_params(m, 3, DType::f32);
  const ParamMap fused = fuse(params, m);
  const std::string gate_up = "model.layers.0.mlp.experts.gate_up_proj", down = "model.layers.0.mlp.experts.down_proj";

  ParamMap half = fused;
  half.erase(down);
  save_safetensors(path, half);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("'" + gate_up + "' but not '" + down + "'"));

  ParamMap misshaped = fused;
  misshaped[gate_up] = Tensor::zeros({4, 6, 8}, DType::f32);  // gate only: [E, I, C]
  save_safetensors(path, misshaped);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32),
                    Catch::Contains(gate_up) && Catch::Contains("[4, 6, 8]") && Catch::Contains("[4, 12, 8]"));
  misshaped = fused;
  misshaped[down] = Tensor::zeros({4, 6, 8}, DType::f32);  // transposed: [E, I, C]
  save_safetensors(path, misshaped);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains(down) && Catch::Contains("[4, 8, 6]"));

  ParamMap doubled = fused;
  const std::string one = moe_expert_weight(m, "model.layers.0.", 2, 1);
  doubled[one] = params.at(one);
  save_safetensors(path, doubled);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("expert 2 of layer 0 twice") && Catch::Contains(one));

  const ModelConfig mx = moe_config("mixtral", {{"num_local_experts", 3}, {"num_hidden_layers", 1}});
  ParamMap both = fuse(init_params(mx, 3, DType::f32), mx);
  both["model.layers.0.block_sparse_moe.gate.weight"] = both.at("model.layers.0.mlp.gate.weight");
  save_safetensors(path, both);
  CHECK_THROWS_WITH(load_weights(path, mx, DType::f32), Catch::Contains("holds both 'model.layers.0.mlp.gate.weight'"));
}
