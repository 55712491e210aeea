// Forward logits and loss, and every parameter gradient, of GPT-2, Llama (GQA, untied head; with
// biases and a decoupled head_dim), Qwen3 (q/k norms, yarn), Qwen3-MoE (with and without the
// load-balancing loss), Gemma 2 and 3, and attention sinks (gpt-oss's)
// against the independent PyTorch reference tests/ref/model_ref.py (Debian's python3-torch, run as
// /usr/bin/python3), from the same safetensors weights and tokens: logits and loss within 1e-5
// relative in f32 and 1e-10 in f64; gradients within 1e-4 in f32 and 1e-9 in f64. The Llama cases
// also run with runtime.tiled_mlp (one swiglu_mlp op per layer) against the same reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/temp_dir.h"
#include "config/config.h"
#include "graph/autograd.h"
#include "models/model.h"
#include "models/weights.h"
#include "engine/executor.h"
#include "tensor/safetensors.h"

using namespace autosp;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  nlohmann::json model;
  bool strip_gpt2_prefix = false;
  bool tiled_mlp = false;  // runtime.tiled_mlp: the reference is the same (it reads only "model")
  bool tiled_loss = false;  // runtime.tiled_loss: likewise; the predictions are the reference logits' argmax
};

// Random weights (std 0.05, norm weights around 1, small biases) saved in f64 with HF names.
ParamMap random_weights(const ModelConfig& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  ParamMap out;
  for (const auto& spec : param_specs(m)) {
    std::vector<double> v(static_cast<size_t>(shape_numel(spec.shape)));
    const bool norm = spec.shape.size() == 1 && spec.name.find("bias") == std::string::npos;
    for (auto& x : v) x = norm ? 1.0 + 0.1 * nd(rng) : (spec.shape.size() == 1 ? 0.02 : 0.05) * nd(rng);
    out[spec.name] = Tensor::from_vector(spec.shape, v);
  }
  return out;
}

TensorMap random_batch(int64_t B, int64_t S, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(B * S), labels(B * S), pos(B * S);
  for (int64_t i = 0; i < B * S; ++i) {
    ids[i] = static_cast<int64_t>(rng() % V);
    labels[i] = i % 7 == 3 ? -100 : static_cast<int64_t>(rng() % V);
    pos[i] = i % S + (i / S) * 3;  // the second row starts at position 3: position_ids really are used
  }
  return {{"input_ids", Tensor::from_vector({B, S}, ids)},
          {"labels", Tensor::from_vector({B, S}, labels)},
          {"position_ids", Tensor::from_vector({B, S}, pos)}};
}

double max_rel_error(const Tensor& got, const Tensor& want) {
  auto g = got.to_doubles(), w = want.to_doubles();
  REQUIRE(g.size() == w.size());
  double scale = 1e-300, err = 0;
  for (double x : w) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < g.size(); ++i) err = std::max(err, std::abs(g[i] - w[i]));
  return err / scale;
}

}  // namespace

TEST_CASE("model forward and gradients match the PyTorch reference", "[model][torch]") {
  const std::vector<Case> cases = {
      {"gpt2", {{"arch", "gpt2"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                {"num_attention_heads", 4}, {"max_position_embeddings", 64}}},
      {"gpt2-noprefix", {{"arch", "gpt2"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 1},
                         {"num_attention_heads", 2}, {"max_position_embeddings", 64}}, true},
      {"llama-gqa", {{"arch", "llama"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                     {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
                     {"max_position_embeddings", 128}, {"rope_theta", 10000.0}}},
      {"llama-tied-mha", {{"arch", "llama"}, {"vocab_size", 80}, {"hidden_size", 48}, {"num_hidden_layers", 1},
                          {"num_attention_heads", 3}, {"intermediate_size", 40}, {"tie_word_embeddings", true},
                          {"rope_theta", 500.0}}},
      {"llama-gqa-tiled-mlp", {{"arch", "llama"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                               {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
                               {"max_position_embeddings", 128}, {"rope_theta", 10000.0}}, false, true},
      {"gpt2-tiled-loss", {{"arch", "gpt2"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                         {"num_attention_heads", 4}, {"max_position_embeddings", 64}}, false, false, true},
      {"llama-gqa-tiled-loss", {{"arch", "llama"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                                {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
                                {"max_position_embeddings", 128}, {"rope_theta", 10000.0}}, false, true, true},
      // Qwen3 (q_norm / k_norm, head_dim 16 apart from 32 / 4, attention_bias) with the yarn paths
      // transformers 4.44 lacks (original_max_position_embeddings apart from max_position_embeddings,
      // mscale / mscale_all_dim, truncate false), against the reference's own transcription.
      {"qwen3-yarn", {{"arch", "qwen3"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 48},
                      {"attention_bias", true}, {"max_position_embeddings", 1024}, {"rope_theta", 100.0},
                      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096},
                                        {"mscale", 1.0}, {"mscale_all_dim", 0.5}, {"truncate", false}}}}},
      // Qwen3-MoE (transformers 4.44 lacks it): q/k norms, head_dim 16, 5 experts of width 12, top 2
      // renormalised, layer 1 dense (mlp_only_layers) and layer 2 sparse, against the reference's
      // transcription of Qwen3MoeSparseMoeBlock.
      {"qwen3-moe", {{"arch", "qwen3_moe"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 3},
                     {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 48},
                     {"num_experts", 5}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 12},
                     {"norm_topk_prob", true}, {"mlp_only_layers", {1}}, {"max_position_embeddings", 128}}},
      // The same with the load-balancing loss (coefficient 0.3, so it moves the loss and every
      // gradient): over the sparse layers 0 and 2, every token counted, the -100 labels too.
      {"qwen3-moe-aux", {{"arch", "qwen3_moe"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 3},
                         {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                         {"intermediate_size", 48}, {"num_experts", 5}, {"num_experts_per_tok", 2},
                         {"moe_intermediate_size", 12}, {"norm_topk_prob", true}, {"mlp_only_layers", {1}},
                         {"max_position_embeddings", 128}, {"output_router_logits", true},
                         {"router_aux_loss_coef", 0.3}}},
      // Llama with every bias and a head_dim apart from hidden / heads (transformers >= 4.45 reads it).
      // Mistral's sliding window, 8 keys of the 37: it cuts (full attention would differ).
      {"mistral-window", {{"arch", "mistral"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
                          {"sliding_window", 8}}},
      // gpt-oss's attention sinks (model.attention_sinks, values around 1 so they take a real share
      // of each softmax) with GQA and a window of 8 that cuts: the reference transcribes
      // modeling_gpt_oss.py's eager attention (the sink as an extra logit column), dsinks included.
      {"mistral-window-sinks", {{"arch", "mistral"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                                {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
                                {"sliding_window", 8}, {"attention_sinks", true}}},
      // Qwen2's rule: the layers from max_window_layers on (here 1 and 2 of 3) get the window; and
      // Qwen3 with transformers 5's layer_types (the first layer windowed, the second full).
      {"qwen2-window-layers", {{"arch", "qwen2"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 3},
                               {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
                               {"sliding_window", 6}, {"max_window_layers", 1}}},
      {"qwen3-layer-types", {{"arch", "qwen3"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                             {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 8},
                             {"intermediate_size", 48}, {"sliding_window", 5},
                             {"layer_types", {"sliding_attention", "full_attention"}}}},
      {"llama-bias-head-dim", {{"arch", "llama"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 1},
                               {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 12},
                               {"intermediate_size", 48}, {"attention_bias", true}, {"mlp_bias", true}}},
      // Gemma 2: (1 + w) norms before and after attention and MLP, GeGLU, the scaled embedding, both
      // softcaps (small, so that they bend the logits), query_pre_attn_scalar apart from the head
      // dim, and windows of 6 on layers 0 and 2 of 3 (37 tokens: they cut).
      {"gemma2", {{"arch", "gemma2"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 3},
                  {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 48},
                  {"sliding_window", 6}, {"query_pre_attn_scalar", 24}, {"attn_logit_softcapping", 0.5},
                  {"final_logit_softcapping", 1.5}}},
      // Gemma 3: q/k norms, local layers 0 and 1 of 3 (pattern 3) with their own RoPE base,
      // linear rope scaling on the global layer only, no attention softcap.
      {"gemma3", {{"arch", "gemma3_text"}, {"vocab_size", 96}, {"hidden_size", 32}, {"num_hidden_layers", 3},
                  {"num_attention_heads", 4}, {"num_key_value_heads", 1}, {"head_dim", 8}, {"intermediate_size", 48},
                  {"sliding_window", 5}, {"sliding_window_pattern", 3}, {"rope_theta", 1e5},
                  {"rope_local_base_freq", 50.0}, {"rope_scaling", {{"rope_type", "linear"}, {"factor", 4.0}}},
                  {"query_pre_attn_scalar", 8}, {"final_logit_softcapping", 2.0}}},
  };
  for (const auto& c : cases) {
    for (const std::string dtype : {"float32", "float64"}) {
      DYNAMIC_SECTION(c.name << " " << dtype) {
        const test::TempDir tmp("ref-" + c.name + "-" + dtype);
        const fs::path& dir = tmp.dir;
        nlohmann::json cfg_json = {{"model", c.model}, {"runtime", {{"dtype", dtype}, {"tiled_mlp", c.tiled_mlp}, {"tiled_loss", c.tiled_loss}}},
                                   {"data", {{"seq_len", 37}, {"batch_size", 2}}}};
        std::ofstream(dir / "cfg.json") << cfg_json.dump();
        Config cfg = parse_config(cfg_json);
        const DType dt = dtype == "float32" ? DType::f32 : DType::f64;

        ParamMap weights = random_weights(cfg.model, 11);
        ParamMap on_disk;
        for (const auto& [n, t] : weights)
          on_disk[c.strip_gpt2_prefix && n.rfind("transformer.", 0) == 0 ? n.substr(12) : n] = t;
        save_safetensors((dir / "w.safetensors").string(), on_disk);
        TensorMap batch = random_batch(2, 37, cfg.model.vocab_size, 5);
        save_safetensors((dir / "batch.safetensors").string(), batch);

        const std::string cmd = "OMP_NUM_THREADS=2 /usr/bin/python3 " + std::string(AUTOSP_SOURCE_DIR) +
                                "/tests/ref/model_ref.py --config " + (dir / "cfg.json").string() + " --weights " +
                                (dir / "w.safetensors").string() + " --batch " + (dir / "batch.safetensors").string() +
                                " --dtype " + dtype + " --out " + (dir / "ref.safetensors").string() + " --grads";
        REQUIRE(std::system(cmd.c_str()) == 0);
        SafetensorsFile ref = load_safetensors((dir / "ref.safetensors").string());

        // Our side loads the same file (exercising the loader's name handling) in the run dtype.
        ParamMap params = load_weights((dir / "w.safetensors").string(), cfg.model, dt);
        auto g = build_forward(cfg.model, dt, ForwardMode::train,
                               {.tiled_mlp = cfg.runtime.tiled_mlp, .tiled_loss = cfg.runtime.tiled_loss,
                                .router_aux_loss = cfg.model.output_router_logits});
        CHECK((g->find("aux_loss") != nullptr) == cfg.model.output_router_logits);
        CHECK((g->find("l0.mlp") != nullptr) == c.tiled_mlp);
        CHECK((g->find("logits") == nullptr) == c.tiled_loss);
        std::vector<Node*> param_nodes = g->with_role(Role::parameter);
        std::vector<Node*> grads = build_backward(*g, g->find("loss"), param_nodes);
        TensorMap feeds = batch;
        for (auto& [n, t] : params) feeds[n] = t;
        RunResult r = Executor(*g).run(feeds);

        const double tol = dt == DType::f32 ? 1e-5 : 1e-10;
        const Tensor& want_logits = ref.tensors.at("logits");
        if (c.tiled_loss) {  // no logits: the predictions are the reference's argmax
          const auto w = want_logits.to_doubles();
          const int64_t V = want_logits.dim(-1);
          const Tensor pred = r.outputs.at("predictions");
          REQUIRE(pred.numel() * V == want_logits.numel());
          for (int64_t t = 0; t < pred.numel(); ++t)
            CHECK(pred.data<int64_t>()[t] == std::max_element(w.begin() + t * V, w.begin() + (t + 1) * V) -
                                                 (w.begin() + t * V));
        }
        double logits_err = c.tiled_loss ? 0.0 : max_rel_error(r.outputs.at("logits"), want_logits);
        double loss_err = max_rel_error(r.outputs.at("loss"), ref.tensors.at("loss"));
        INFO("logits rel err " << logits_err << ", loss rel err " << loss_err);
        CHECK(logits_err < tol);
        CHECK(loss_err < tol);
        CHECK(r.peak_bytes > 0);

        const double gtol = dt == DType::f32 ? 1e-4 : 1e-9;
        for (size_t i = 0; i < param_nodes.size(); ++i) {
          std::string name = param_nodes[i]->name();
          if (c.strip_gpt2_prefix) name = name.substr(12);
          const Tensor& want = ref.tensors.at("grad." + name);
          double err = max_rel_error(r.outputs.at(grads[i]->name()), want);
          INFO("gradient of " << name << ": rel err " << err);
          CHECK(err < gtol);
        }
      }
    }
  }
}

// Checkpoints transformers wrote before 4.31 carry each layer's rotary inverse frequencies; its
// loader ignores them, and so does ours (the values are recomputed from the config). Anything else
// unknown is still refused.
TEST_CASE("a Llama weights file with rotary_emb.inv_freq buffers loads as transformers loads it", "[model]") {
  const test::TempDir tmp("ref-weights-inv-freq");
  ModelConfig m;
  m.arch = Arch::llama;
  m.vocab_size = 16;
  m.hidden_size = 8;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.intermediate_size = 12;
  m.max_position_embeddings = 8;
  const ParamMap good = random_weights(m, 3);
  ParamMap with_buffers = good;
  for (int l = 0; l < 2; ++l)
    with_buffers[str("model.layers.", l, ".self_attn.rotary_emb.inv_freq")] = Tensor::zeros({2}, DType::f32);
  const std::string path = (tmp.dir / "w.safetensors").string();
  save_safetensors(path, with_buffers);
  const ParamMap loaded = load_weights(path, m, DType::f32);
  REQUIRE(loaded.size() == good.size());
  for (const auto& [name, t] : good) CHECK(loaded.at(name).to_doubles() == t.to(DType::f32).to_doubles());
  with_buffers["model.layers.0.self_attn.rotary_emb.scale"] = Tensor::zeros({2}, DType::f32);
  save_safetensors(path, with_buffers);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("not a parameter"));
}

TEST_CASE("weights files that do not fit the model are named errors", "[model]") {
  const test::TempDir tmp("ref-weights-garbage");
  const fs::path& dir = tmp.dir;
  ModelConfig m;
  m.vocab_size = 16;
  m.hidden_size = 8;
  m.num_hidden_layers = 1;
  m.num_attention_heads = 2;
  m.max_position_embeddings = 8;
  ParamMap good = random_weights(m, 1);
  const std::string path = (dir / "w.safetensors").string();

  ParamMap missing = good;
  missing.erase("transformer.ln_f.bias");
  save_safetensors(path, missing);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("missing tensor 'transformer.ln_f.bias'"));

  ParamMap wrong_shape = good;
  wrong_shape["transformer.wte.weight"] = Tensor::zeros({17, 8}, DType::f32);
  save_safetensors(path, wrong_shape);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("[17, 8]") && Catch::Contains("[16, 8]"));

  ParamMap extra = good;
  extra["transformer.h.5.mlp.c_fc.weight"] = Tensor::zeros({8, 32}, DType::f32);
  save_safetensors(path, extra);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("not a parameter"));

  // Files from llm.c are named for what they are (its 256 × int32 header: magic, version, ...).
  for (const auto& [magic, expect] : {std::pair<int32_t, std::string>{20240326, "an llm.c model checkpoint (magic 20240326, version 3)"},
                                      {20240520, "an llm.c token shard (magic 20240520), not model weights"},
                                      {20240801, "an llm.c token shard (magic 20240801)"}}) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic, header[1] = 3, header[2] = 1024;
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(header.data()), 1024);
    CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains(expect));
  }

  ParamMap ints = good;
  ints["transformer.ln_f.bias"] = Tensor::zeros({8}, DType::i64);
  save_safetensors(path, ints);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("float dtype"));

  ParamMap twice = good;
  twice["ln_f.bias"] = good.at("transformer.ln_f.bias");
  save_safetensors(path, twice);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("appears twice"));

  ParamMap buffers = good;  // HF GPT-2 files carry attention-mask buffers: ignored
  buffers["transformer.h.0.attn.bias"] = Tensor::zeros({1, 1, 8, 8}, DType::f32);
  save_safetensors(path, buffers);
  CHECK(load_weights(path, m, DType::f64).size() == good.size());

  std::ofstream(path, std::ios::trunc) << "not a safetensors file";
  CHECK_THROWS_AS(load_weights(path, m, DType::f32), UsageError);

  // Gemma's extra norms: a missing or misshaped one is named.
  ModelConfig gm;
  gm.arch = Arch::gemma2;
  gm.vocab_size = 16;
  gm.hidden_size = 8;
  gm.num_hidden_layers = 2;
  gm.num_attention_heads = 2;
  gm.num_key_value_heads = 2;
  gm.intermediate_size = 12;
  ParamMap gemma = random_weights(gm, 2);
  REQUIRE(gemma.count("model.layers.1.pre_feedforward_layernorm.weight"));
  ParamMap no_norm = gemma;
  no_norm.erase("model.layers.1.post_feedforward_layernorm.weight");
  save_safetensors(path, no_norm);
  CHECK_THROWS_WITH(load_weights(path, gm, DType::f32),
                    Catch::Contains("missing tensor 'model.layers.1.post_feedforward_layernorm.weight'"));
  ParamMap bad_norm = gemma;
  bad_norm["model.layers.0.pre_feedforward_layernorm.weight"] = Tensor::zeros({8, 1}, DType::f32);
  save_safetensors(path, bad_norm);
  CHECK_THROWS_WITH(load_weights(path, gm, DType::f32),
                    Catch::Contains("model.layers.0.pre_feedforward_layernorm.weight") && Catch::Contains("[8, 1]"));

  // gpt-oss's sinks: one per query head, else named; absent from a model with sinks, named too.
  ModelConfig sm = gm;
  sm.arch = Arch::mistral;
  sm.attention_sinks = true;
  ParamMap sinks = random_weights(sm, 3);
  REQUIRE(sinks.count("model.layers.1.self_attn.sinks"));
  save_safetensors(path, sinks);
  CHECK(load_weights(path, sm, DType::f32).size() == sinks.size());
  sinks["model.layers.1.self_attn.sinks"] = Tensor::zeros({3}, DType::f32);
  save_safetensors(path, sinks);
  CHECK_THROWS_WITH(load_weights(path, sm, DType::f32), Catch::Contains("'model.layers.1.self_attn.sinks' has shape [3]") &&
                                                            Catch::Contains("expects [2]"));
  sinks.erase("model.layers.1.self_attn.sinks");
  save_safetensors(path, sinks);
  CHECK_THROWS_WITH(load_weights(path, sm, DType::f32), Catch::Contains("missing tensor 'model.layers.1.self_attn.sinks'"));
}
