// Hugging Face formats without transformers (tests/ref/hf_roundtrip.py runs the real one): config.json
// translation against GPT2Config / LlamaConfig's documented keys and defaults, model.from and its
// overrides, every unknown key named at once with a hint, sharded safetensors written and read back
// bit for bit, the lm_head / tie_word_embeddings checks, and a checkpoint directory that is an HF
// model directory.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/temp_dir.h"
#include "config/config.h"
#include "models/hf_config.h"
#include "models/model.h"
#include "models/weights.h"
#include "tensor/safetensors.h"
#include "train/checkpoint.h"

using namespace autosp;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct TempDir : test::TempDir {
  explicit TempDir(const std::string& name) : test::TempDir("hf-" + name) {}
  std::string operator/(const std::string& f) const { return path(f); }
};

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

const json kLlama = {{"model_type", "llama"},         {"architectures", {"LlamaForCausalLM"}},
                     {"vocab_size", 64},              {"hidden_size", 32},
                     {"intermediate_size", 48},       {"num_hidden_layers", 2},
                     {"num_attention_heads", 4},      {"num_key_value_heads", 2},
                     {"max_position_embeddings", 128}, {"rms_norm_eps", 1e-5},
                     {"rope_theta", 500000.0},        {"tie_word_embeddings", false},
                     {"torch_dtype", "bfloat16"},     {"transformers_version", "4.44.2"},
                     {"bos_token_id", 1},             {"attention_dropout", 0.0},
                     {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}}}};

bool same(const ParamMap& a, const ParamMap& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    if (!b.count(name) || b.at(name).shape() != t.shape() || b.at(name).dtype() != t.dtype()) return false;
    if (std::memcmp(b.at(name).raw(), t.raw(), static_cast<size_t>(t.nbytes())) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("GPT2Config keys and defaults become ours", "[models][hf]") {
  // GPT2Config(): vocab 50257, n_positions 1024, n_embd 768, n_layer 12, n_head 12, eps 1e-5, pdrop 0.1.
  const HfModelConfig hf = translate_hf_config(
      {{"model_type", "gpt2"}, {"n_embd", 64}, {"n_layer", 3}, {"resid_pdrop", 0.1}, {"use_cache", true},
       {"activation_function", "gelu_new"}, {"n_inner", nullptr}, {"summary_type", "cls_index"}},
      "g.json");
  CHECK(hf.model == json{{"arch", "gpt2"}, {"vocab_size", 50257}, {"hidden_size", 64}, {"num_hidden_layers", 3},
                         {"num_attention_heads", 12}, {"max_position_embeddings", 1024}, {"norm_eps", 1e-5},
                         {"tie_word_embeddings", true}});
  CHECK(hf.math_free == std::vector<std::string>{"model_type", "summary_type", "use_cache"});
  REQUIRE(hf.warnings.size() == 1);
  CHECK_THAT(hf.warnings[0], Catch::Contains("resid_pdrop = 0.1 is not applied"));
}

TEST_CASE("LlamaConfig keys, GQA and llama3 rope_scaling become ours", "[models][hf]") {
  const HfModelConfig hf = translate_hf_config(kLlama, "l.json");
  CHECK(hf.model["arch"] == "llama");
  CHECK(hf.model["norm_eps"] == 1e-5);
  CHECK(hf.model["num_key_value_heads"] == 2);
  CHECK(hf.model["rope_scaling"]["original_max_position_embeddings"] == 64);
  CHECK(hf.warnings.empty());
  // LlamaConfig(): num_key_value_heads defaults to num_attention_heads, rms_norm_eps to 1e-6.
  const HfModelConfig bare = translate_hf_config({{"model_type", "llama"}, {"num_attention_heads", 8}}, "b.json");
  CHECK(bare.model["num_key_value_heads"] == 8);
  CHECK(bare.model["norm_eps"] == 1e-6);
  CHECK(bare.model["rope_theta"] == 10000.0);
  CHECK_FALSE(bare.model.contains("rope_scaling"));
}

TEST_CASE("unsupported HF settings are named, all at once", "[models][hf]") {
  json bad = kLlama;
  bad["attention_bias"] = "yes";
  bad["sliding_window"] = 4096;
  bad["hidden_act"] = "gelu";
  bad["n_experts"] = 8;
  bad["layer_types"] = {"full_attention", "sliding_attention"};
  CHECK_THROWS_WITH(translate_hf_config(bad, "l.json"),
                    Catch::StartsWith("l.json: ") && Catch::Contains("attention_bias = \"yes\": expected true or false") &&
                        Catch::Contains("sliding_window = 4096") && Catch::Contains("hidden_act = \"gelu\"") &&
                        Catch::Contains("unknown key 'n_experts'") &&
                        Catch::Contains("layer_types[1] = \"sliding_attention\" is not supported (layer 1"));
  for (const json& scaling : {json{{"rope_type", "dynamic"}, {"factor", 2.0}}, json{{"factor", 2.0}},
                              json{{"rope_type", "linear"}, {"factor", 0.5}},
                              json{{"rope_type", "linear"}, {"factor", 2.0}, {"beta_fast", 32}}}) {
    json b = kLlama;
    b["rope_scaling"] = scaling;
    INFO(scaling.dump());
    CHECK_THROWS_WITH(translate_hf_config(b, "l.json"), Catch::Contains("rope_scaling"));
  }
  CHECK_THROWS_WITH(translate_hf_config({{"model_type", "gpt2"}, {"n_embd", 64}, {"n_inner", 100}}, "g.json"),
                    Catch::Contains("n_inner = 100"));
  CHECK_THROWS_WITH(translate_hf_config({{"model_type", "gpt2"}, {"tie_word_embeddings", false}}, "g.json"),
                    Catch::Contains("tie_word_embeddings = false"));
  CHECK_THROWS_WITH(translate_hf_config({{"model_type", "deepseek_v3"}}, "m.json"), Catch::Contains("\"deepseek_v3\""));
}

// The fixtures: the same tiny models' config.json as transformers 5.24 and 4.44.2 wrote them
// (tests/models/fixtures/hf_config/make_fixtures.py).
json fixture(const std::string& version, const std::string& name) {
  return json::parse(std::ifstream(std::string(AUTOSP_SOURCE_DIR) + "/tests/models/fixtures/hf_config/" + version + "/" +
                                   name + ".json"));
}

TEST_CASE("transformers 5's config.json (rope_parameters, dtype, layer_types) reads as 4.44's", "[models][hf]") {
  for (const char* name : {"llama", "qwen2", "mistral"}) {
    INFO(name);
    const json v5 = fixture("tf5", name), v4 = fixture("tf4", name);
    REQUIRE(v5.contains("rope_parameters"));
    REQUIRE(v4.contains("rope_theta"));
    const HfModelConfig a = translate_hf_config(v5, "tf5.json"), b = translate_hf_config(v4, "tf4.json");
    CHECK(a.model == b.model);
    CHECK(a.model["arch"] == name);
  }
  const json llama = translate_hf_config(fixture("tf5", "llama"), "l").model;
  CHECK(llama["rope_theta"] == 100.0);
  CHECK(llama["rope_scaling"]["rope_type"] == "llama3");
  CHECK(llama["attention_bias"] == true);
  CHECK(llama["mlp_bias"] == true);
  CHECK_FALSE(llama.contains("head_dim"));  // 8 = 32 / 4, the default
  const json qwen2 = translate_hf_config(fixture("tf5", "qwen2"), "q").model;
  CHECK(qwen2["rope_scaling"] == json{{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 256}});
  CHECK(qwen2["tie_word_embeddings"] == true);
  CHECK(translate_hf_config(fixture("tf5", "mistral"), "m").model["head_dim"] == 16);
  const json qwen3 = translate_hf_config(fixture("tf5", "qwen3"), "q3").model;
  CHECK(qwen3["arch"] == "qwen3");
  CHECK(qwen3["head_dim"] == 16);
  CHECK(qwen3["rope_theta"] == 10000.0);
  CHECK_FALSE(qwen3.contains("rope_scaling"));  // rope_type "default"
  // Both spellings together (our checkpoints) must agree.
  json both = fixture("tf5", "llama");
  both["rope_theta"] = 100.0;
  both["rope_scaling"] = fixture("tf4", "llama")["rope_scaling"];
  CHECK(translate_hf_config(both, "b").model == llama);
  both["rope_theta"] = 200.0;
  CHECK_THROWS_WITH(translate_hf_config(both, "b"), Catch::Contains("rope_theta = 200.0 differs from rope_parameters.rope_theta"));
  // Every pair of spellings (issue 48): the dtype's, and a rope section's type and rope_type.
  json dtypes = fixture("tf5", "llama");
  dtypes["dtype"] = "bfloat16";
  dtypes["torch_dtype"] = "bfloat16";
  CHECK(translate_hf_config(dtypes, "d").model == llama);
  dtypes["torch_dtype"] = nullptr;  // as absent
  CHECK(translate_hf_config(dtypes, "d").model == llama);
  dtypes["torch_dtype"] = "float32";
  CHECK_THROWS_WITH(translate_hf_config(dtypes, "d.json"),
                    Catch::StartsWith("d.json: ") &&
                        Catch::Contains("torch_dtype = \"float32\" differs from dtype = \"bfloat16\" (two spellings "
                                        "of one setting: they must agree)"));
  json types = fixture("tf4", "llama");
  types["rope_scaling"]["type"] = "llama3";
  CHECK(translate_hf_config(types, "t").model == llama);
  types["rope_scaling"]["type"] = "linear";
  CHECK_THROWS_WITH(translate_hf_config(types, "t"),
                    Catch::Contains("rope_type = \"llama3\" differs from type = \"linear\""));
}

TEST_CASE("each family's checkpoint config.json translates back to its model", "[models][hf]") {
  for (const char* name : {"llama", "qwen2", "mistral", "qwen3"}) {
    INFO(name);
    json src = translate_hf_config(fixture("tf5", name), "f").model;
    const Config c = parse_config({{"model", src}, {"data", {{"seq_len", 16}}}}, {}, "c.json");
    const json hf = hf_config_json(c.model, DType::bf16);
    CHECK(hf["dtype"] == "bfloat16");
    CHECK(hf["torch_dtype"] == "bfloat16");
    CHECK(hf["rope_parameters"]["rope_theta"] == hf["rope_theta"]);
    CHECK(translate_hf_config(hf, "back").model == c.resolved["model"]);
    CHECK(model_json(c.model) == c.resolved["model"]);
    // Its parameters: the family's biases and norms.
    std::set<std::string> names;
    for (const auto& p : param_specs(c.model)) names.insert(p.name);
    const std::string l0 = "model.layers.0.";
    CHECK(names.count(l0 + "self_attn.q_proj.bias") == (std::string(name) == "llama" || std::string(name) == "qwen2"));
    CHECK(names.count(l0 + "self_attn.o_proj.bias") == (std::string(name) == "llama"));
    CHECK(names.count(l0 + "mlp.down_proj.bias") == (std::string(name) == "llama"));
    CHECK(names.count(l0 + "self_attn.q_norm.weight") == (std::string(name) == "qwen3"));
    CHECK(names.count("lm_head.weight") == (std::string(name) != "qwen2"));  // the qwen2 fixture is tied
  }
}

TEST_CASE("an HF config.json keeps every key through autosp and back, for every family", "[models][hf]") {
  // Each family as transformers 4.44 and 5.24 wrote it (GPT-2 as GPT2Config writes it), into our
  // model section, a parsed run config, and the checkpoint's config.json with the keys carried.
  std::vector<json> sources = {{{"model_type", "gpt2"},       {"architectures", {"GPT2LMHeadModel"}},
                                {"vocab_size", 96},           {"n_positions", 64},
                                {"n_embd", 32},               {"n_layer", 2},
                                {"n_head", 4},                {"n_inner", nullptr},
                                {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5},
                                {"resid_pdrop", 0.0},         {"embd_pdrop", 0.0},
                                {"attn_pdrop", 0.0},          {"scale_attn_weights", true},
                                {"bos_token_id", 50256},      {"eos_token_id", 50256},
                                {"initializer_range", 0.02},  {"tie_word_embeddings", true},
                                {"task_specific_params", {{"text-generation", {{"max_length", 50}}}}}}};
  for (const char* version : {"tf4", "tf5"})
    for (const char* name : {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "gemma2"})
      if (fs::exists(std::string(AUTOSP_SOURCE_DIR) + "/tests/models/fixtures/hf_config/" + version + "/" + name + ".json"))
        sources.push_back(fixture(version, name));
  REQUIRE(sources.size() == 11);
  // Gemma 3's text model (not in transformers 4.44): gemma-3-1b's config.json, made tiny, with linear
  // rope scaling (its larger siblings') and the local layers' RoPE base.
  sources.push_back({{"model_type", "gemma3_text"}, {"architectures", {"Gemma3ForCausalLM"}}, {"vocab_size", 96},
                     {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 3},
                     {"num_attention_heads", 4}, {"num_key_value_heads", 1}, {"head_dim", 8},
                     {"hidden_activation", "gelu_pytorch_tanh"}, {"max_position_embeddings", 256},
                     {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"rope_local_base_freq", 10000.0},
                     {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}, {"attention_bias", false},
                     {"attention_dropout", 0.0}, {"query_pre_attn_scalar", 8}, {"sliding_window", 4},
                     {"sliding_window_pattern", 3}, {"final_logit_softcapping", nullptr},
                     {"attn_logit_softcapping", nullptr}, {"cache_implementation", "hybrid"}, {"bos_token_id", 2},
                     {"eos_token_id", 1}, {"pad_token_id", 0}, {"torch_dtype", "bfloat16"}, {"use_cache", true}});
  // Qwen3-MoE (not in transformers 4.44): Qwen3-30B-A3B's config.json, made tiny.
  sources.push_back({{"model_type", "qwen3_moe"}, {"architectures", {"Qwen3MoeForCausalLM"}},
                     {"vocab_size", 96}, {"hidden_size", 32}, {"intermediate_size", 48},
                     {"moe_intermediate_size", 12}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                     {"num_key_value_heads", 2}, {"head_dim", 16}, {"num_experts", 8},
                     {"num_experts_per_tok", 2}, {"norm_topk_prob", true}, {"decoder_sparse_step", 1},
                     {"mlp_only_layers", json::array()}, {"output_router_logits", false},
                     {"router_aux_loss_coef", 0.001}, {"max_position_embeddings", 256},
                     {"rope_theta", 1000000.0}, {"rope_scaling", nullptr}, {"rms_norm_eps", 1e-6},
                     {"hidden_act", "silu"}, {"attention_bias", false}, {"attention_dropout", 0.0},
                     {"use_sliding_window", false}, {"sliding_window", nullptr}, {"max_window_layers", 48},
                     {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}});
  // gpt-oss (not in transformers 4.44): openai/gpt-oss-20b's config.json, made tiny; its MXFP4
  // quantization_config is read on load and dropped on save (a checkpoint is dequantized).
  const json gpt_oss_hub = {{"model_type", "gpt_oss"}, {"architectures", {"GptOssForCausalLM"}},
                     {"attention_bias", true}, {"attention_dropout", 0.0}, {"eos_token_id", 200002},
                     {"experts_per_token", 2}, {"head_dim", 8}, {"hidden_act", "silu"}, {"hidden_size", 32},
                     {"initial_context_length", 64}, {"initializer_range", 0.02}, {"intermediate_size", 32},
                     {"layer_types", {"sliding_attention", "full_attention"}}, {"max_position_embeddings", 256},
                     {"num_attention_heads", 4}, {"num_experts_per_tok", 2}, {"num_hidden_layers", 2},
                     {"num_key_value_heads", 2}, {"num_local_experts", 4}, {"output_router_logits", false},
                     {"pad_token_id", 95},
                     {"quantization_config", {{"modules_to_not_convert", {"model.layers.*.self_attn", "lm_head"}},
                                              {"quant_method", "mxfp4"}}},
                     {"rms_norm_eps", 1e-5},
                     {"rope_scaling", {{"beta_fast", 32.0}, {"beta_slow", 1.0}, {"factor", 4.0},
                                       {"original_max_position_embeddings", 64}, {"rope_type", "yarn"},
                                       {"truncate", false}}},
                     {"rope_theta", 150000}, {"router_aux_loss_coef", 0.9}, {"sliding_window", 4},
                     {"swiglu_limit", 7.0}, {"tie_word_embeddings", false}, {"transformers_version", "4.55.0.dev0"},
                     {"use_cache", true}, {"vocab_size", 96}};
  sources.push_back(gpt_oss_hub);
  std::set<std::string> families_seen;
  for (const json& src : sources) {
    INFO(src.dump());
    const HfModelConfig in = translate_hf_config(src, "src");
    const Config c = parse_config({{"model", in.model}, {"data", {{"seq_len", 16}}}}, {}, "c.json");
    const json out = hf_config_json(c.model, DType::f32, in.carried);
    families_seen.insert(in.model["arch"].get<std::string>());
    for (auto it = src.begin(); it != src.end(); ++it) {
      const std::string& key = it.key();
      INFO(key);
      if (key == "transformers_version" || key == "dtype" || key == "torch_dtype") continue;  // the writer's
      if (key == "quantization_config") {  // dequantized on load: the checkpoint is not quantized
        CHECK(!out.contains(key));
        continue;
      }
      REQUIRE(out.contains(key));
      // Qwen's window off: its sliding_window value is kept as none (null), which is what it means.
      if (key == "sliding_window" && src.value("use_sliding_window", true) == false) continue;
      const json& a = *it;
      const json& b = out[key];
      CHECK((a == b || (a.is_number() && b.is_number() && a.get<double>() == b.get<double>())));
    }
    CHECK(translate_hf_config(out, "out").model == in.model);
  }
  CHECK(families_seen.size() == kNumArchs);
}

TEST_CASE("the families' unsupported settings are named", "[models][hf]") {
  struct Row {
    const char* fixture;
    json patch;
    std::string message;
  };
  for (const Row& r : std::vector<Row>{
           {"qwen2", {{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 0.0}, {"rope_theta", 1e4}}}},
            "\"factor\" = 0: expected a number >= 1"},
           {"qwen2", {{"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 2.0}}}}, "rope_type \"dynamic\" is not supported"},
           {"qwen2", {{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 2.0}, {"truncate", 1}}}}, "\"truncate\" = 1"},
           {"qwen2", {{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_fast", -1}}}}, "\"beta_fast\" = -1"},
           {"qwen2", {{"rope_parameters", {{"rope_theta", 1e4}, {"partial_rotary_factor", 0.5}}}}, "partial_rotary_factor = 0.5"},
           {"qwen2", {{"layer_types", {"full_attention"}}}, "layer_types has 1 entries for num_hidden_layers 2"},
           {"qwen3", {{"layer_types", {"full_attention", "linear_attention"}}}, "layer_types[1] = \"linear_attention\""},
           {"qwen3", {{"head_dim", 15}}, "head_dim = 15: expected an even positive integer"},
           {"mistral", {{"head_dim", 0}}, "head_dim = 0"},
           {"mistral", {{"hidden_act", "gelu"}}, "hidden_act = \"gelu\""},
           {"mistral", {{"attention_bias", true}}, "unknown key 'attention_bias'"},
           {"qwen2", {{"use_sliding_window", true}, {"sliding_window", -3}}, "sliding_window = -3"},
           {"gemma2", {{"hidden_activation", "gelu"}}, "hidden_activation = \"gelu\" is not supported"},
           {"gemma2", {{"use_bidirectional_attention", true}}, "use_bidirectional_attention = true is not supported"},
           {"gemma2", {{"attn_logit_softcapping", "50"}}, "attn_logit_softcapping = \"50\": expected a number"},
           {"gemma2", {{"mlp_bias", true}}, "unknown key 'mlp_bias'"},
           {"gemma2", {{"layer_types", "sliding_attention"}}, "layer_types"},
       }) {
    json bad = fixture(std::string(r.fixture) == "gemma2" ? "tf4" : "tf5", r.fixture);  // 4.44's Gemma 2
    bad.merge_patch(r.patch);
    INFO(bad.dump());
    CHECK_THROWS_WITH(translate_hf_config(bad, "x.json"), Catch::StartsWith("x.json: ") && Catch::Contains(r.message));
  }
  // Gemma 2's layers alternate, local first (transformers 4.44: layer l slides when l is even); a
  // softcap or scalar out of range in config.json is named by the model section's check.
  const Config g = parse_config({{"model", translate_hf_config(fixture("tf4", "gemma2"), "g").model}}, {}, "c.json");
  CHECK(g.model.layer_window(0) == 8);
  CHECK(g.model.layer_window(1) == 0);
  CHECK(g.model.attention_scale() == 1.0 / std::sqrt(24.0));
  json bad_cap = fixture("tf4", "gemma2");
  bad_cap["final_logit_softcapping"] = -1.0;
  CHECK_THROWS_WITH(parse_config({{"model", translate_hf_config(bad_cap, "g").model}}, {}, "c.json"),
                    Catch::Contains("model.final_logit_softcapping = -1"));
  // A sliding window is kept, also where it cuts (shorter than the sequence): every Mistral layer has it.
  json window = fixture("tf5", "mistral");
  window["sliding_window"] = 16;
  window.erase("layer_types");
  const json m = translate_hf_config(window, "w").model;
  CHECK(m["sliding_window"] == 16);
  const Config mc = parse_config({{"model", m}, {"data", {{"seq_len", 17}}}}, {}, "c.json");
  CHECK(mc.model.sliding_window == 16);
  CHECK(mc.model.layer_window(0) == 16);
  // Qwen's window is off unless use_sliding_window.
  json qwen = fixture("tf4", "qwen2");
  qwen["sliding_window"] = 4;
  CHECK_FALSE(translate_hf_config(qwen, "q").model.contains("sliding_window"));
  // Switched on without a sliding_window key, it is Qwen2Config's and Qwen3Config's default, 4096
  // (transformers 4.44), not none; without max_window_layers (Qwen2Config's 28) it reaches no layer
  // of these two-layer models, and with max_window_layers 1 the second layer.
  for (const char* name : {"qwen2", "qwen3"}) {
    json on = fixture("tf5", name);
    on["use_sliding_window"] = true;
    on.erase("sliding_window");
    on.erase("max_window_layers");
    on.erase("layer_types");
    const json m = translate_hf_config(on, "q").model;
    CHECK(m["sliding_window"] == 4096);
    const Config c = parse_config({{"model", m}, {"data", {{"seq_len", 4100}}}}, {}, "c.json");
    CHECK(c.model.layer_window(0) == 0);
    CHECK(c.model.layer_window(1) == 0);
    on["max_window_layers"] = 1;
    const Config c1 = parse_config({{"model", translate_hf_config(on, "q").model}}, {}, "c.json");
    CHECK(c1.model.layer_window(0) == 0);
    CHECK(c1.model.layer_window(1) == 4096);
    // transformers 5's layer_types, when present, says which layers; an unknown kind is named.
    on["layer_types"] = {"sliding_attention", "full_attention"};
    const Config c2 = parse_config({{"model", translate_hf_config(on, "q").model}}, {}, "c.json");
    CHECK(c2.model.layer_window(0) == 4096);
    CHECK(c2.model.layer_window(1) == 0);
    on["layer_types"] = {"sliding_attention", "chunked_attention"};
    CHECK_THROWS_WITH(parse_config({{"model", translate_hf_config(on, "q").model}}, {}, "c.json"),
                      Catch::Contains("model.layer_types[1] = \"chunked_attention\""));
  }
}

TEST_CASE("every unknown key is named at once, with a hint", "[config][hf]") {
  CHECK_THROWS_WITH(parse_config({{"model", {{"n_embd", 64}, {"n_layer", 2}, {"rms_norm_eps", 1e-5}}},
                                  {"train", {{"stesp", 3}, {"seq_len", 8}}},
                                  {"trian", json::object()}},
                                 {}, "c.json"),
                    Catch::StartsWith("c.json: 6 problems:\n  - unknown key ") &&
                        Catch::Contains("'model.n_embd' (did you mean 'model.hidden_size'?)") &&
                        Catch::Contains("'model.n_layer' (did you mean 'model.num_hidden_layers'?)") &&
                        Catch::Contains("'model.rms_norm_eps' (did you mean 'model.norm_eps'?)") &&
                        Catch::Contains("'train.stesp' (did you mean 'train.steps'?)") &&
                        Catch::Contains("'train.seq_len' (did you mean 'data.seq_len'?)") &&
                        Catch::Contains("'trian' (did you mean 'train'?)"));
  CHECK_THROWS_WITH(parse_config({{"model", {{"activation_function", "gelu_new"}}}}, {}, "c.json"),
                    Catch::Contains("a Hugging Face config.json key?"));
}

TEST_CASE("model.from takes the directory's config; keys beside it override", "[config][hf]") {
  TempDir d("from");
  write(d / "config.json", kLlama.dump());
  const Config c = parse_config({{"model", {{"from", d.dir.string()}, {"max_position_embeddings", 256}}},
                                 {"data", {{"seq_len", 16}}}},
                                {}, "c.json");
  CHECK(c.model_from == d.dir.string());
  CHECK(c.model.arch == Arch::llama);
  CHECK(c.model.num_key_value_heads == 2);
  CHECK(c.model.norm_eps == 1e-5);
  CHECK(c.model.max_position_embeddings == 256);
  CHECK(c.model.rope_scaling.rope_type == "llama3");
  CHECK(c.model.rope_scaling.factor == 8.0);
  CHECK_FALSE(c.resolved["model"].contains("from"));
  bool override_noted = false, keys_listed = false;
  for (const auto& n : c.notes) {
    override_noted |= n.find("model.max_position_embeddings = 256 overrides") != std::string::npos;
    keys_listed |= n.find("not used by autosp (Hugging Face keys that do not change the math): ") != std::string::npos &&
                   n.find("transformers_version") != std::string::npos;
  }
  CHECK(override_noted);
  CHECK(keys_listed);
  // A bare HF config.json as the run config: its architecture, fresh weights.
  const Config bare = load_config(d / "config.json", {"data.seq_len=16"});
  CHECK(bare.model.hidden_size == 32);
  CHECK(bare.model_from.empty());
  // The checkpoint side: hf_config_json translates back to the same model.
  CHECK(translate_hf_config(hf_config_json(c.model, DType::f32), "back").model == c.resolved["model"]);
  CHECK(model_json(c.model) == c.resolved["model"]);
}

TEST_CASE("model.from: null beside sliding_window lifts the directory's window", "[config][hf]") {
  // Mistral-7B-v0.1's window of 4096, trained past it: windowed attention as it is, full with null.
  TempDir d("window");
  json mistral = fixture("tf5", "mistral");
  mistral["sliding_window"] = 32;
  write(d / "config.json", mistral.dump());
  const json run = {{"model", {{"from", d.dir.string()}}}, {"data", {{"seq_len", 64}}}};
  CHECK(parse_config(run, {}, "c.json").model.layer_window(1) == 32);
  const Config c = parse_config(run, {"model.sliding_window=null"}, "c.json");
  CHECK(c.model.sliding_window == 0);
  bool noted = false;
  for (const auto& n : c.notes) noted |= n.find("model.sliding_window = null overrides") != std::string::npos;
  CHECK(noted);
  // A checkpoint of it writes no window, and reads back the same.
  const json hf = hf_config_json(c.model, DType::f32);
  CHECK(hf["sliding_window"].is_null());
  CHECK(translate_hf_config(hf, "back").model == c.resolved["model"]);
  // Qwen's switched window likewise.
  json qwen = fixture("tf5", "qwen2");
  qwen["use_sliding_window"] = true;
  qwen["sliding_window"] = 32;
  write(d / "config.json", qwen.dump());
  CHECK(parse_config(run, {"model.sliding_window=null"}, "c.json").model.sliding_window == 0);
}

TEST_CASE("sharded weights round-trip bit for bit, and an HF directory is checked", "[models][hf]") {
  TempDir d("shards");
  write(d / "config.json", kLlama.dump());
  const Config c = parse_config({{"model", {{"from", d.dir.string()}}}, {"data", {{"seq_len", 16}}}}, {}, "c.json");
  const ParamMap p = init_params(c.model, 7, DType::f32);
  const auto files = save_hf_weights(d.dir.string(), p, 20000);
  REQUIRE(files.size() > 2);
  CHECK(files.back() == "model.safetensors.index.json");
  CHECK(load_safetensors(d / files[0]).metadata == std::map<std::string, std::string>{{"format", "pt"}});
  CHECK(same(load_weights(d.dir.string(), c.model, DType::f32), p));
  CHECK(same(load_weights(d / "model.safetensors.index.json", c.model, DType::f32), p));
  // f16 and bf16 files are widened exactly (the conversion is the tensor library's, tested there).
  for (DType half : {DType::f16, DType::bf16}) {
    ParamMap h, widened;
    for (const auto& [name, t] : p) h[name] = t.to(half), widened[name] = h[name].to(DType::f32);
    save_weights(d / "half.safetensors", h);
    CHECK(same(load_weights(d / "half.safetensors", c.model, DType::f32), widened));
  }
  // A wrong head count (same shapes) or a forgotten rope_scaling is refused by the directory's config.json.
  ModelConfig heads = c.model;
  heads.num_attention_heads = 8;
  heads.num_key_value_heads = 4;
  CHECK_THROWS_WITH(load_weights(d.dir.string(), heads, DType::f32),
                    Catch::Contains("config.json: num_attention_heads is 4 but this run's model.num_attention_heads is 8"));
  ModelConfig plain = c.model;
  plain.rope_scaling = {};
  CHECK_THROWS_WITH(load_weights(d / files[0], plain, DType::f32), Catch::Contains("rope_scaling"));
  ModelConfig eps = c.model;
  eps.norm_eps = 1e-6;
  CHECK_THROWS_WITH(load_weights(d.dir.string(), eps, DType::f32), Catch::Contains("rms_norm_eps is 1e-05"));
  // A shard holding a tensor the index does not map to it.
  json index = json::parse(std::ifstream(d / "model.safetensors.index.json"));
  const std::string moved = index["weight_map"].begin().key();
  index["weight_map"][moved] = files[1] == index["weight_map"][moved] ? files[0] : files[1];
  write(d / "model.safetensors.index.json", index.dump());
  CHECK_THROWS_WITH(load_weights(d.dir.string(), c.model, DType::f32), Catch::Contains("is not mapped to this shard"));
}

TEST_CASE("an --init-from config.json value of the wrong type is named as such, not as another model",
          "[models][hf]") {
  // model.from says `model.hidden_size = "32": expected an integer`; the directory check of
  // --init-from (load_weights) must say the same instead of `hidden_size is "32" but … is 32`.
  TempDir d("types");
  write(d / "config.json", kLlama.dump());
  const ModelConfig m = parse_config({{"model", {{"from", d.dir.string()}}}, {"data", {{"seq_len", 16}}}}, {}, "c.json").model;
  const std::string file = d / "config.json";
  struct Row {
    const char* key;
    json value;
    std::string message;
  };
  for (const Row& r : std::vector<Row>{{"hidden_size", "32", file + ": hidden_size = \"32\": expected an integer"},
                                      {"hidden_size", 32.5, file + ": hidden_size = 32.5: expected an integer"},
                                      {"rms_norm_eps", "1e-5", file + ": rms_norm_eps = \"1e-5\": expected a number"},
                                      {"tie_word_embeddings", 0, file + ": tie_word_embeddings = 0: expected true or false"},
                                      {"max_position_embeddings", "128",
                                       file + ": max_position_embeddings = \"128\": expected an integer"}}) {
    json bad = kLlama;
    bad[r.key] = r.value;
    write(file, bad.dump());
    CHECK_THROWS_AS(load_weights(d.dir.string(), m, DType::f32), UsageError);
    CHECK_THROWS_WITH(load_weights(d.dir.string(), m, DType::f32), r.message);
  }
  // A number where ours is a number (rope_theta 500000 written as an integer) still matches.
  json integral = kLlama;
  integral["rope_theta"] = 500000;
  write(file, integral.dump());
  CHECK_NOTHROW(check_hf_dir_matches(d.dir.string(), m));
}

TEST_CASE("a head that differs from a tied embedding points at tie_word_embeddings", "[models][hf]") {
  TempDir d("tied");
  ModelConfig m;
  m.arch = Arch::llama;
  m.vocab_size = 32, m.hidden_size = 16, m.num_hidden_layers = 1, m.num_attention_heads = 2;
  m.num_key_value_heads = 2, m.intermediate_size = 24;
  m.tie_word_embeddings = false;
  ParamMap untied = init_params(m, 3, DType::f32);
  save_weights(d / "untied.safetensors", untied);
  ModelConfig tied = m;
  tied.tie_word_embeddings = true;
  CHECK_THROWS_WITH(load_weights(d / "untied.safetensors", tied, DType::f32),
                    Catch::Contains("'lm_head.weight' differs from 'model.embed_tokens.weight'") &&
                        Catch::Contains("set model.tie_word_embeddings false"));
  ParamMap copy = init_params(tied, 3, DType::f32);
  copy["lm_head.weight"] = copy.at("model.embed_tokens.weight");  // a tied file that kept the copy
  save_weights(d / "copy.safetensors", copy);
  CHECK(load_weights(d / "copy.safetensors", tied, DType::f32).count("lm_head.weight") == 0);
  ParamMap headless = untied;
  headless.erase("lm_head.weight");
  save_weights(d / "headless.safetensors", headless);
  CHECK_THROWS_WITH(load_weights(d / "headless.safetensors", m, DType::f32),
                    Catch::Contains("set model.tie_word_embeddings true"));
  ModelConfig g;  // GPT-2 always ties
  g.vocab_size = 32, g.hidden_size = 16, g.num_hidden_layers = 1, g.num_attention_heads = 2;
  ParamMap gp = init_params(g, 4, DType::f32);
  gp["lm_head.weight"] = init_params(g, 5, DType::f32).at("transformer.wte.weight");
  save_weights(d / "gpt2.safetensors", gp);
  CHECK_THROWS_WITH(load_weights(d / "gpt2.safetensors", g, DType::f32),
                    Catch::Contains("tie_word_embeddings must be true"));
}

TEST_CASE("a checkpoint is a Hugging Face model directory, sharded above max_shard_mb", "[train][hf]") {
  TempDir d("ckpt");
  write(d / "config.json", kLlama.dump());
  for (double shard_mb : {5000.0, 0.02}) {
    INFO("max_shard_mb " << shard_mb);
    const Config c = parse_config({{"model", {{"from", d.dir.string()}}}, {"data", {{"seq_len", 16}}},
                                   {"train", {{"max_shard_mb", shard_mb}}}},
                                  {}, "c.json");
    const ParamMap p = init_params(c.model, 9, DType::f32);
    AdamW opt;
    opt.init(p);
    const std::string root = d / ("run" + std::to_string(shard_mb < 1));
    const fs::path step = save_checkpoint(root, 5, p, opt, c);
    CHECK(fs::exists(step / "config.json"));
    CHECK(fs::exists(step / (shard_mb < 1 ? "model.safetensors.index.json" : "model.safetensors")));
    const json hf = json::parse(std::ifstream(step / "config.json"));
    CHECK(hf["architectures"] == json{"LlamaForCausalLM"});
    CHECK(hf["torch_dtype"] == "float32");
    CHECK(hf["rope_scaling"]["rope_type"] == "llama3");
    const Checkpoint ck = load_checkpoint(root, c, DType::f32);
    CHECK(same(ck.params, p));
    // model.from accepts it back.
    CHECK(parse_config({{"model", {{"from", step.string()}}}, {"data", {{"seq_len", 16}}}}, {}, "c.json").resolved["model"] ==
          c.resolved["model"]);
  }
}
