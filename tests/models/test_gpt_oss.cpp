// gpt-oss's config.json and weights (models/hf_config.h, models/gpt_oss_experts.h, tensor/mxfp4.h).
// The config against GptOssConfig's defaults and rules as configuration_gpt_oss.py states them; the
// stacked experts built here element by element from modeling_gpt_oss.py's layout (gate = columns
// 0::2, up = 1::2, x @ W) and MXFP4 against a hand-written E2M1 table and powers of two, not by the
// code under test; every malformed input is a named error.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>

#include "common/temp_dir.h"
#include "config/config.h"
#include "models/gpt_oss_experts.h"
#include "models/hf_config.h"
#include "tensor/mxfp4.h"
#include "tensor/safetensors.h"

using namespace autosp;
using json = nlohmann::json;

namespace {

ModelConfig tiny(json more = json::object()) {
  json m = {{"arch", "gpt_oss"}, {"vocab_size", 32}, {"hidden_size", 32}, {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 8}, {"intermediate_size", 32},
            {"num_local_experts", 3}, {"num_experts_per_tok", 2}, {"sliding_window", 4},
            {"max_position_embeddings", 64}};
  m.update(more);
  return parse_config({{"model", m}, {"data", {{"seq_len", 16}}}}).model;
}

// A value unique to (tensor, index), exact in f32.
double value(int tensor, int64_t i) { return tensor * 4096.0 + static_cast<double>(i) * 0.25 - 1000.0; }

}  // namespace

TEST_CASE("gpt-oss's config.json: GptOssConfig's defaults, alternating windows, yarn, and back", "[models][hf][gpt_oss]") {
  const HfModelConfig in = translate_hf_config({{"model_type", "gpt_oss"}}, "c");
  const json& m = in.model;
  CHECK(m["arch"] == "gpt_oss");
  CHECK(m["vocab_size"] == 201088);
  CHECK(m["hidden_size"] == 2880);
  CHECK(m["intermediate_size"] == 2880);  // the experts' width
  CHECK(m["num_hidden_layers"] == 36);
  CHECK(m["num_attention_heads"] == 64);
  CHECK(m["num_key_value_heads"] == 8);
  CHECK(m["head_dim"] == 64);
  CHECK(m["num_local_experts"] == 128);
  CHECK(m["num_experts_per_tok"] == 4);
  CHECK(m["sliding_window"] == 128);
  CHECK(m["tie_word_embeddings"] == false);
  CHECK(m["norm_eps"] == 1e-5);
  CHECK(m["rope_theta"] == 150000.0);
  CHECK(m["swiglu_limit"] == 7.0);
  CHECK(m["swiglu_alpha"] == 1.702);
  CHECK(m["router_aux_loss_coef"] == 0.001);
  CHECK(m["output_router_logits"] == false);
  // rope_parameters left out: GptOssConfig's yarn, truncate false.
  CHECK(m["rope_scaling"] == json{{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                                  {"original_max_position_embeddings", 4096}, {"truncate", false}});
  CHECK(!m.contains("layer_types"));  // GptOssConfig's default is the family's alternation

  const ModelConfig t = tiny();
  CHECK(t.has_sinks());
  CHECK(t.layer_window(0) == 4);  // sliding where (l + 1) % 2 != 0
  CHECK(t.layer_window(1) == 0);
  CHECK(t.sparse_layer(0));
  CHECK(t.sparse_layer(1));
  CHECK(t.expert_width() == 32);
  const json hf = hf_config_json(t, DType::bf16);
  CHECK(hf["model_type"] == "gpt_oss");
  CHECK(hf["architectures"] == json{"GptOssForCausalLM"});
  CHECK(hf["layer_types"] == json{"sliding_attention", "full_attention"});
  CHECK(hf["num_local_experts"] == 3);
  CHECK(hf["swiglu_limit"] == 7.0);
  CHECK(hf["attention_bias"] == true);
  CHECK(hf["tie_word_embeddings"] == false);
  CHECK(!hf.contains("quantization_config"));
  CHECK(!hf.contains("attention_sinks"));  // no HF key: the model type says it
  CHECK(!hf.contains("sliding_window_pattern"));
  CHECK(translate_hf_config(hf, "back").model == model_json(t));

  // layer_types given: kept where they differ from the alternation.
  json other = hf;
  other["layer_types"] = {"full_attention", "sliding_attention"};
  const ModelConfig swapped = parse_config({{"model", translate_hf_config(other, "o").model}, {"data", {{"seq_len", 16}}}}).model;
  CHECK(swapped.layer_window(0) == 0);
  CHECK(swapped.layer_window(1) == 4);
}

TEST_CASE("gpt-oss's bad config values are named", "[models][hf][gpt_oss]") {
  const json base = {{"model_type", "gpt_oss"}, {"num_hidden_layers", 2}, {"num_local_experts", 4}};
  auto refused = [&](json more, const std::string& want) {
    json c = base;
    c.update(more);
    INFO(c.dump());
    CHECK_THROWS_WITH(parse_config({{"model", translate_hf_config(c, "config.json").model}, {"data", {{"seq_len", 16}}}}),
                      Catch::Contains(want));
  };
  refused({{"swiglu_limit", 0}}, "swiglu_limit = 0: expected a positive number");
  refused({{"swiglu_limit", -7.0}}, "swiglu_limit = -7.0: expected a positive number");
  refused({{"swiglu_alpha", "1.702"}}, "swiglu_alpha = \"1.702\": expected a number");
  refused({{"num_experts_per_tok", 5}}, "model.num_experts_per_tok 5 exceeds model.num_local_experts 4");
  refused({{"quantization_config", {{"quant_method", "gptq"}, {"bits", 4}}}},
          "quantization_config.quant_method = \"gptq\" is not supported");
  refused({{"quantization_config", "mxfp4"}}, "quantization_config.quant_method = null is not supported");
  refused({{"layer_types", {"sliding_attention"}}, {"sliding_window", 4}}, "layer_types has 1 entries");
  refused({{"layer_types", {"sliding_attention", "chunked_attention"}}, {"sliding_window", 4}},
          "layer_types[1] = \"chunked_attention\"");
  refused({{"sliding_window", 0}}, "sliding_window = 0: expected a positive integer or null");
  refused({{"attention_bias", false}}, "attention_bias = false is not supported (gpt-oss's attention has q/k/v/o biases)");
  // mxfp4 is gpt-oss's: another family's quantized checkpoint is refused as before.
  CHECK_THROWS_WITH(translate_hf_config({{"model_type", "llama"}, {"quantization_config", {{"quant_method", "mxfp4"}}}}, "l"),
                    Catch::Contains("quantization_config = {\"quant_method\":\"mxfp4\"} is not supported"));
  // Accepted and dropped: mxfp4 (the loader dequantizes); the hub's own-format keys are carried.
  json hub = base;
  hub["quantization_config"] = {{"quant_method", "mxfp4"}, {"modules_to_not_convert", {"lm_head"}}};
  hub["experts_per_token"] = 4;
  const HfModelConfig ok = translate_hf_config(hub, "hub");
  CHECK(!ok.carried.contains("quantization_config"));
  CHECK(ok.carried["experts_per_token"] == 4);
}

TEST_CASE("gpt-oss's stacked experts split into per-expert tensors element by element, and fuse back",
          "[models][gpt_oss]") {
  const ModelConfig m = tiny({{"hidden_size", 6}, {"intermediate_size", 5}, {"head_dim", 2}});
  const int64_t E = 3, C = 6, I = 5;
  std::map<std::string, Tensor> file;
  for (int64_t l = 0; l < 2; ++l) {
    const std::string layer = str("model.layers.", l, ".mlp.experts.");
    const int k = static_cast<int>(l) * 4;
    std::vector<double> gu(E * C * 2 * I), gub(E * 2 * I), dn(E * I * C), dnb(E * C);
    for (size_t i = 0; i < gu.size(); ++i) gu[i] = value(k, static_cast<int64_t>(i));
    for (size_t i = 0; i < gub.size(); ++i) gub[i] = value(k + 1, static_cast<int64_t>(i));
    for (size_t i = 0; i < dn.size(); ++i) dn[i] = value(k + 2, static_cast<int64_t>(i));
    for (size_t i = 0; i < dnb.size(); ++i) dnb[i] = value(k + 3, static_cast<int64_t>(i));
    file[layer + "gate_up_proj"] = Tensor::from_vector<double>({E, C, 2 * I}, gu);
    file[layer + "gate_up_proj_bias"] = Tensor::from_vector<double>({E, 2 * I}, gub);
    file[layer + "down_proj"] = Tensor::from_vector<double>({E, I, C}, dn);
    file[layer + "down_proj_bias"] = Tensor::from_vector<double>({E, C}, dnb);
  }
  file["model.norm.weight"] = Tensor::from_vector<double>({C}, std::vector<double>(C, 1.0));
  const std::map<std::string, Tensor> original = file;
  split_gpt_oss_experts(file, m, "w.safetensors");
  CHECK(file.size() == 1 + 2 * E * 6);
  for (int64_t l = 0; l < 2; ++l) {
    const int k = static_cast<int>(l) * 4;
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = str("model.layers.", l, ".mlp.experts.", e, ".");
      const auto at = [&](const std::string& n) { return file.at(p + n).to_doubles(); };
      const std::vector<double> g = at("gate_proj.weight"), u = at("up_proj.weight"), d = at("down_proj.weight");
      const std::vector<double> gb = at("gate_proj.bias"), ub = at("up_proj.bias"), db = at("down_proj.bias");
      REQUIRE(file.at(p + "gate_proj.weight").shape() == Shape{I, C});
      REQUIRE(file.at(p + "down_proj.weight").shape() == Shape{C, I});
      for (int64_t i = 0; i < I; ++i) {
        for (int64_t c = 0; c < C; ++c) {
          // gate_up_proj[e, c, 2i] and [e, c, 2i + 1]; down_proj[e, i, c]
          CHECK(g[i * C + c] == value(k, (e * C + c) * 2 * I + 2 * i));
          CHECK(u[i * C + c] == value(k, (e * C + c) * 2 * I + 2 * i + 1));
          CHECK(d[c * I + i] == value(k + 2, (e * I + i) * C + c));
        }
        CHECK(gb[i] == value(k + 1, e * 2 * I + 2 * i));
        CHECK(ub[i] == value(k + 1, e * 2 * I + 2 * i + 1));
      }
      for (int64_t c = 0; c < C; ++c) CHECK(db[c] == value(k + 3, e * C + c));
    }
  }
  // Back into transformers' layout: bit for bit the tensors it came from.
  fuse_gpt_oss_experts(file, m);
  REQUIRE(file.size() == original.size());
  for (const auto& [name, t] : original) {
    INFO(name);
    REQUIRE(file.count(name));
    CHECK(file.at(name).shape() == t.shape());
    CHECK(file.at(name).to_doubles() == t.to_doubles());
  }

  // A layer without one of its four, a misshaped one, an expert given both ways: named.
  auto refused = [&](std::map<std::string, Tensor> bad, const std::string& want) {
    CHECK_THROWS_WITH(split_gpt_oss_experts(bad, m, "w.safetensors"), Catch::Contains(want));
  };
  std::map<std::string, Tensor> missing = original;
  missing.erase("model.layers.1.mlp.experts.down_proj_bias");
  refused(missing, "w.safetensors: holds 'model.layers.1.mlp.experts.");
  refused(missing, "but not 'model.layers.1.mlp.experts.down_proj_bias'");
  std::map<std::string, Tensor> misshaped = original;
  misshaped["model.layers.0.mlp.experts.gate_up_proj"] = Tensor::zeros({E, 2 * I, C}, DType::f32);  // nn.Linear's
  refused(misshaped, "tensor 'model.layers.0.mlp.experts.gate_up_proj' has shape [3, 10, 6], the model expects [3, 6, 10]");
  std::map<std::string, Tensor> twice = original;
  twice["model.layers.0.mlp.experts.2.up_proj.bias"] = Tensor::zeros({I}, DType::f32);
  refused(twice, "holds expert 2 of layer 0 twice: as 'model.layers.0.mlp.experts.2.up_proj.bias'");
}

TEST_CASE("MXFP4 dequantizes as transformers' table and scales say", "[models][gpt_oss][mxfp4]") {
  // E2M1, written out: nibble n is the value kTable[n].
  const double kTable[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int n = 0; n < 16; ++n) CHECK(fp4_value(static_cast<uint8_t>(n)) == kTable[n]);
  CHECK(std::signbit(fp4_value(8)));
  // Two rows of one block: byte j = (15 - j) << 4 | j, so every nibble is both a low and a high one;
  // scales 2^-2, 2^0, 2^1, 2^3 (125, 127, 128, 130) and a subnormal-free extreme (1: 2^-126).
  const uint8_t scale_bytes[] = {125, 127, 128, 130, 1};
  const double scale_values[] = {0.25, 1, 2, 8, std::ldexp(1.0, -126)};
  ByteTensor blocks{{5, 1, 16}, {}}, scales{{5, 1}, {}};
  for (int r = 0; r < 5; ++r) {
    for (int j = 0; j < 16; ++j) blocks.data.push_back(static_cast<uint8_t>((15 - j) << 4 | j));
    scales.data.push_back(scale_bytes[r]);
  }
  const Tensor out = mxfp4_dequantize(blocks, scales, "b", "s", "f");
  REQUIRE(out.shape() == Shape{5, 32});
  REQUIRE(out.dtype() == DType::f32);
  const std::vector<double> v = out.to_doubles();
  for (int r = 0; r < 5; ++r)
    for (int j = 0; j < 16; ++j) {
      CHECK(v[r * 32 + 2 * j] == kTable[j] * scale_values[r]);          // the low nibble: the even element
      CHECK(v[r * 32 + 2 * j + 1] == kTable[15 - j] * scale_values[r]);  // the high nibble: the odd one
    }
  // A few bytes by hand: 0x21 at scale 128 is (0.5, 1) · 2; 0x9F at scale 126 is (-6, -0.5) / 2.
  ByteTensor few{{1, 16}, std::vector<uint8_t>(16, 0)}, few_scales{{1}, {128}};
  few.data[0] = 0x21;
  few.data[1] = 0x9F;
  std::vector<double> w = mxfp4_dequantize(few, few_scales, "b", "s", "f").to_doubles();
  CHECK(w[0] == 1.0);
  CHECK(w[1] == 2.0);
  CHECK(w[2] == -12.0);
  CHECK(w[3] == -1.0);
  few_scales.data[0] = 126;
  w = mxfp4_dequantize(few, few_scales, "b", "s", "f").to_doubles();
  CHECK(w[2] == -3.0);
  CHECK(w[3] == -0.25);
  // Overflow is ±inf (the weights loader then refuses the tensor as non-finite).
  few_scales.data[0] = 255;
  const std::vector<double> huge = mxfp4_dequantize(few, few_scales, "b", "s", "f").to_doubles();
  CHECK(huge[0] == std::ldexp(1.0, 127));  // 0.5 · 2^128
  CHECK(std::isinf(huge[1]));              // 1 · 2^128

  CHECK_THROWS_WITH(mxfp4_dequantize(ByteTensor{{5, 1, 8}, std::vector<uint8_t>(40)}, scales, "x_blocks", "x_scales", "f"),
                    Catch::Contains("f: tensor 'x_blocks' has shape [5, 1, 8]: MXFP4 blocks are [..., blocks, 16]"));
  CHECK_THROWS_WITH(mxfp4_dequantize(blocks, ByteTensor{{5, 2}, std::vector<uint8_t>(10)}, "x_blocks", "x_scales", "f"),
                    Catch::Contains("f: tensor 'x_scales' has shape [5, 2], its blocks 'x_blocks' [5, 1, 16] need one "
                                    "scale per block [5, 1]"));
}

TEST_CASE("the hub's MXFP4 experts dequantize into transformers' stacked layout", "[models][gpt_oss][mxfp4]") {
  const ModelConfig m = tiny({{"num_hidden_layers", 1}});  // C = I = 32: one block of 32 per row
  const int64_t E = 3, C = 32, I = 32;
  auto byte_of = [](int64_t i) { return static_cast<uint8_t>((i * 37 + 11) % 256); };
  auto scale_of = [](int64_t i) { return static_cast<uint8_t>(120 + i % 15); };
  SafetensorsFile file;
  const std::string p = "model.layers.0.mlp.experts.";
  for (const auto& [proj, rows] : {std::pair{std::string("gate_up_proj"), 2 * I}, std::pair{std::string("down_proj"), C}}) {
    ByteTensor b{{E, rows, 1, 16}, {}}, s{{E, rows, 1}, {}};
    for (int64_t i = 0; i < E * rows * 16; ++i) b.data.push_back(byte_of(i));
    for (int64_t i = 0; i < E * rows; ++i) s.data.push_back(scale_of(i));
    file.bytes[p + proj + "_blocks"] = b;
    file.bytes[p + proj + "_scales"] = s;
  }
  const std::map<std::string, ByteTensor> bytes = file.bytes;
  dequantize_gpt_oss_experts(file, m, "hub");
  CHECK(file.bytes.empty());
  // Element [e, k, r] of the dequantized [E, K, rows] is input k of output row r: byte k / 2 of row
  // (e, r)'s block, its low nibble for even k, times 2^(scale - 127).
  const double kTable[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (const auto& [proj, rows, K] : {std::tuple{std::string("gate_up_proj"), 2 * I, C}, std::tuple{std::string("down_proj"), C, I}}) {
    INFO(proj);
    const Tensor& t = file.tensors.at(p + proj);
    REQUIRE(t.shape() == (Shape{E, K, rows}));
    const std::vector<double> v = t.to_doubles();
    int64_t bad = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t row = e * rows + r;
          const uint8_t byte = byte_of(row * 16 + k / 2);
          const double want = kTable[k % 2 == 0 ? byte & 15 : byte >> 4] * std::ldexp(1.0, scale_of(row) - 127);
          bad += v[(e * K + k) * rows + r] != want;
        }
    CHECK(bad == 0);
  }

  auto refused = [&](std::map<std::string, ByteTensor> b, const std::string& want, bool dequantized = false) {
    SafetensorsFile f;
    f.bytes = std::move(b);
    if (dequantized) f.tensors[p + "down_proj"] = Tensor::zeros({E, I, C}, DType::f32);
    CHECK_THROWS_WITH(dequantize_gpt_oss_experts(f, m, "hub"), Catch::Contains(want));
  };
  std::map<std::string, ByteTensor> no_scales = bytes;
  no_scales.erase(p + "down_proj_scales");
  refused(no_scales, "hub: holds 'model.layers.0.mlp.experts.down_proj_blocks' but not 'model.layers.0.mlp.experts.down_proj_scales'");
  std::map<std::string, ByteTensor> no_blocks = bytes;
  no_blocks.erase(p + "gate_up_proj_blocks");
  refused(no_blocks, "holds 'model.layers.0.mlp.experts.gate_up_proj_scales' but not 'model.layers.0.mlp.experts.gate_up_proj_blocks'");
  std::map<std::string, ByteTensor> wrong_rows = bytes;
  wrong_rows[p + "gate_up_proj_blocks"].shape = {E, I, 2, 16};
  refused(wrong_rows, "tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks' has shape [3, 32, 2, 16], the model expects [3, 64, 1, 16]");
  std::map<std::string, ByteTensor> wrong_scales = bytes;
  wrong_scales[p + "down_proj_scales"].shape = {E, C};
  refused(wrong_scales, "tensor 'model.layers.0.mlp.experts.down_proj_scales' has shape [3, 32]");
  refused(bytes, "holds 'model.layers.0.mlp.experts.down_proj' both dequantized and as MXFP4", true);
  std::map<std::string, ByteTensor> stray = bytes;
  stray["model.embed_tokens.weight"] = ByteTensor{{2}, {1, 2}};
  refused(stray, "hub: tensor 'model.embed_tokens.weight' is U8, which autosp reads only as gpt-oss's MXFP4 expert weights");
}

TEST_CASE("safetensors' U8 tensors are read as bytes only when asked", "[tensor][safetensors][mxfp4]") {
  test::TempDir tmp("u8");
  const std::string path = tmp.path("u8.safetensors");
  std::string header = R"({"x_blocks":{"dtype":"U8","shape":[2,3],"data_offsets":[0,6]},)"
                       R"("y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  while (header.size() % 8) header += ' ';
  {
    std::ofstream f(path, std::ios::binary);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
    const unsigned char data[12] = {1, 2, 3, 250, 251, 252, 0, 0, 0, 0, 0x80, 0x3f};  // then 1.0f
    f.write(reinterpret_cast<const char*>(data), 12);
  }
  CHECK_THROWS_WITH(load_safetensors(path), Catch::Contains("tensor 'x_blocks' has unsupported dtype 'U8'"));
  const SafetensorsFile f = load_safetensors(path, /*with_bytes=*/true);
  REQUIRE(f.bytes.count("x_blocks"));
  CHECK(f.bytes.at("x_blocks").shape == Shape{2, 3});
  CHECK(f.bytes.at("x_blocks").data == std::vector<uint8_t>{1, 2, 3, 250, 251, 252});
  CHECK(f.tensors.at("y").to_doubles() == std::vector<double>{1.0});
}
