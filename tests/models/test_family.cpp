// The family table (models/family.h) and the model-key table (models/model_keys.h) against what
// each consumer builds from them: the graph's parameters follow each row's columns (checked by
// parameter name, as Hugging Face's modeling code names them), every row's HF class names lead back
// to it, and every model key reaches the config schema, the resolved config and each family's
// config.json under its HF name. The numerics of each family are checked against transformers and
// float64 references elsewhere (tests/models/test_model_vs_torch.cpp, tests/ref/hf_roundtrip.py).
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "config/config.h"
#include "models/hf_config.h"
#include "models/model.h"

using namespace autosp;
using json = nlohmann::json;

namespace {

// A small model of family `f`, every bias its keys can turn on turned on, untied where it may be.
ModelConfig small(const Family& f, bool biases) {
  json m = {{"arch", f.name}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
            {"num_attention_heads", 4}};
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (key_applies(*find_model_key(k), f)) m[k] = biases;
  if (f.gqa) m["num_key_value_heads"] = 2;
  if (key_applies(*find_model_key("tie_word_embeddings"), f)) m["tie_word_embeddings"] = false;
  return parse_config({{"model", m}, {"data", {{"seq_len", 16}}}}).model;
}

std::set<std::string> param_names(const ModelConfig& m) {
  std::set<std::string> names;
  for (const auto& p : param_specs(m)) names.insert(p.name);
  return names;
}

bool has_suffix(const std::set<std::string>& names, const std::string& suffix) {
  return std::any_of(names.begin(), names.end(), [&](const std::string& n) {
    return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  });
}

}  // namespace

TEST_CASE("the family table has one row per architecture, named once", "[models][family]") {
  std::set<std::string_view> names;
  size_t i = 0;
  for (const Family& f : families()) {
    CHECK(static_cast<size_t>(f.arch) == i++);
    CHECK(&family(f.arch) == &f);
    CHECK(names.insert(f.name).second);
    CHECK(arch_name(f.arch) == f.name);
    // model.arch takes the name, and config.json's model_type or architectures lead back to the row.
    CHECK(parse_config({{"model", {{"arch", f.name}}}}).model.arch == f.arch);
    CHECK(translate_hf_config({{"model_type", f.name}}, "t").model["arch"] == f.name);
    CHECK(translate_hf_config({{"architectures", {f.hf_model_class}}}, "t").model["arch"] == f.name);
  }
  CHECK(i == kNumArchs);
  CHECK_THROWS_WITH(parse_config({{"model", {{"arch", "deepseek_v3"}}}}),
                    Catch::Contains("expected one of gpt2|llama|mistral|qwen2|qwen3|mixtral|qwen2_moe|qwen3_moe|gemma2|gemma3_text|gpt_oss"));
}

TEST_CASE("each family's graph has the parameters its row says", "[models][family]") {
  for (const Family& f : families())
    for (bool biases : {false, true}) {
      INFO(f.name << (biases ? " with" : " without") << " the biases its keys turn on");
      const ModelConfig m = small(f, biases);
      const std::set<std::string> names = param_names(m);
      const std::string attn = f.layout == Layout::gpt2 ? "attn.c_attn.bias" : "self_attn.q_proj.bias";
      const std::string out = f.layout == Layout::gpt2 ? "attn.c_proj.bias" : "self_attn.o_proj.bias";
      const std::string mlp = f.layout == Layout::gpt2 ? "mlp.c_fc.bias" : "mlp.gate_proj.bias";
      CHECK(has_suffix(names, attn) == present(f.qkv_bias, biases));
      CHECK(has_suffix(names, out) == present(f.o_bias, biases));
      CHECK(has_suffix(names, mlp) == present(f.mlp_bias, biases));
      CHECK(has_suffix(names, "q_norm.weight") == f.qk_norm);
      CHECK(has_suffix(names, "ln_1.bias") == (f.norm == Norm::layernorm));
      CHECK(names.count("transformer.wpe.weight") == (f.positions == Positions::learned ? 1u : 0u));
      CHECK(names.count(std::string(f.embedding)) == 1);
      CHECK(names.count("lm_head.weight") == (f.tied_head == Presence::always ? 0u : 1u));  // small(): untied
      // A mixture of experts' sparse layers (every layer here) have experts and a router instead.
      CHECK(has_suffix(names, "mlp.up_proj.weight") == (f.mlp != Mlp::gelu && f.moe == Moe::none));
      // Gemma's post-norms around attention and MLP.
      CHECK(has_suffix(names, "pre_feedforward_layernorm.weight") == f.sandwich_norms);
      CHECK(has_suffix(names, "post_feedforward_layernorm.weight") == f.sandwich_norms);
      CHECK(has_suffix(names, "experts.1.w3.weight") == (f.moe == Moe::mixtral));
      CHECK(has_suffix(names, "mlp.experts.1.up_proj.weight") == (f.moe == Moe::qwen || f.moe == Moe::gpt_oss));
      CHECK(has_suffix(names, "mlp.experts.1.up_proj.bias") == (f.moe == Moe::gpt_oss));  // gpt-oss's experts' biases
      CHECK(has_suffix(names, "mlp.router.bias") == (f.moe == Moe::gpt_oss));
      CHECK(has_suffix(names, "self_attn.sinks") == present(f.sinks, false));
      CHECK(has_suffix(names, "mlp.shared_expert_gate.weight") == f.shared_expert);
      const std::vector<std::string> scopes = layer_scopes(m);
      REQUIRE(scopes.size() == 2);
      CHECK(scopes[1] == std::string(f.layer_scope) + "1.");
      // The graph names its layers' nodes with the same scope.
      const auto g = build_forward(m, DType::f32);
      CHECK(std::any_of(g->nodes().begin(), g->nodes().end(),
                        [&](const auto& n) { return n->name().rfind(scopes[1], 0) == 0; }));
    }
}

TEST_CASE("every model key reaches the schema, the resolved config and each family's config.json",
          "[models][family][config]") {
  const std::vector<std::string> paths = config_key_paths();
  for (const ModelKey& k : model_keys()) {
    INFO(k.name);
    CHECK(std::count(paths.begin(), paths.end(), "model." + k.name) == 1);
    for (const Family& f : families()) {
      INFO(f.name);
      const ModelConfig m = small(f, true);
      const json hf = hf_config_json(m, DType::f32);
      const std::string_view name = hf_key_name(k, f);
      if (!key_applies(k, f) || name.empty()) continue;
      // Written under its HF name (null where it has no value), and read back to the same value.
      REQUIRE(hf.contains(std::string(name)));
      const json ours = k.get(m);
      CHECK((ours.is_null() || hf[std::string(name)] == ours));
      const json back = translate_hf_config(hf, "back").model;
      CHECK(back.value(k.name, json()) == model_json(m).value(k.name, json()));
    }
  }
}
