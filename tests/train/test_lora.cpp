// LoRA (graph/passes/lora.h, models/lora.h, train/adapter.h, the config's lora section):
//   - every bad lora value is a UsageError naming its key: r out of range, an unknown module, a
//     module of another family, PEFT's regex form, an empty target list, a modules_to_save entry
//     the model lacks or that is also a target, a dropout outside [0, 1), unsupported initialisations, the tiled
//     MLP with an MLP target, a lora.from that is not an adapter directory;
//   - the rewrite freezes the base: the joint program's gradients are exactly the adapters (and
//     modules_to_save), the frozen parameters have no gradient, and --plan-memory's optimizer and
//     gradient bytes are those of the adapters alone, the frozen base counted apart; under bf16
//     the frozen base is bf16 itself, the adapters f32 master weights;
//   - under the tiled loss a frozen head gets no dw (weight_grad false) and the run is unchanged;
//     the step's FLOPs count the frozen base at 4 per weight and token (no weight gradient);
//   - the adapted forward equals the base forward with W + scale·B·A (merge_lora, summed in
//     double here) and B = 0 gives the base's loss exactly;
//   - a LoRA run resumed from its checkpoint (an adapter directory) continues bit for bit, and a
//     checkpoint of the other kind (full, or LoRA for a full run) is refused;
//   - an adapter directory round-trips through save_adapter / load_adapter, and garbage in it
//     (bad JSON, another r, another base, a foreign or missing tensor, a wrong shape) is refused
//     naming the file and the key; so is every PEFT setting that changes the math and that autosp
//     does not do (lora_bias, PiSSA-like inits, trainable tokens, target_parameters, an
//     exclude_modules that drops a target, matched as PEFT matches), while settings that leave
//     the math alone are accepted;
//   - a resume checks the base: the checkpoint records it (lora_base_record), and another base
//     (another fingerprint) is refused naming model.from; the same weights elsewhere are accepted.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>

#include "comm/communicator.h"
#include "common/temp_dir.h"
#include "compiler/program.h"
#include "config/config.h"
#include "engine/executor.h"
#include "models/flops.h"
#include "models/lora.h"
#include "models/weights.h"
#include "tensor/check.h"
#include "tensor/safetensors.h"
#include "train/adapter.h"
#include "train/checkpoint.h"
#include "train/train_state.h"
#include "train/trainer.h"

namespace autosp::test {
namespace {

using nlohmann::json;

const json kLlama = {{"arch", "llama"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                     {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48}};
const json kGpt2 = {{"arch", "gpt2"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                    {"num_attention_heads", 4}, {"max_position_embeddings", 64}};

Config config(const json& model, const json& lora, const std::vector<std::string>& sets = {}) {
  return parse_config({{"model", model}, {"data", {{"source", "synthetic"}, {"seq_len", 16}, {"batch_size", 2}}},
                       {"runtime", {{"dtype", "float64"}}}, {"lora", lora}},
                      sets, "run.json");
}

TEST_CASE("lora: every bad value is an error naming its key", "[lora][config]") {
  struct Row {
    json model, lora;
    std::vector<std::string> sets;
    std::string expected;
  };
  const std::vector<Row> rows = {
      {kLlama, {{"r", 0}}, {}, "lora.r = 0: expected an integer in [1, 65536]"},
      {kLlama, {{"r", -4}}, {}, "lora.r = -4"},
      {kLlama, {{"r", "8"}}, {}, "lora.r = \"8\": expected an integer"},
      {kLlama, {{"target_modules", {"qq_proj"}}}, {}, "lora.target_modules: unknown module 'qq_proj' (did you mean 'q_proj'?)"},
      {kLlama, {{"target_modules", {"c_attn"}}}, {}, "lora.target_modules: 'c_attn' is a projection of gpt2, not of llama"},
      {kGpt2, {{"target_modules", {"q_proj"}}}, {}, "lora.target_modules: 'q_proj' is a projection of llama, not of gpt2"},
      {kLlama, {{"target_modules", ".*proj"}}, {}, "lora.target_modules = \".*proj\": expected \"all-linear\""},
      {kLlama, {{"target_modules", json::array()}}, {}, "lora.target_modules = []: expected at least one module"},
      {kLlama, {{"target_modules", {1}}}, {}, "lora.target_modules = [1]: expected a list of module names"},
      {kLlama, {{"target_modules", 3}}, {}, "lora.target_modules = 3: expected a list or a string"},
      {kLlama, {{"modules_to_save", {"lm_heads"}}}, {}, "lora.modules_to_save: 'lm_heads' names no module"},
      {kLlama, {{"modules_to_save", {"q_proj"}}}, {}, "lora.modules_to_save: 'q_proj' is also in lora.target_modules"},
      {kLlama, {{"modules_to_save", "norm"}}, {}, "lora.modules_to_save = \"norm\": expected a list"},
      {kLlama, {{"lora_dropout", 1.5}}, {}, "lora.lora_dropout = 1.5: expected a value in"},
      {kLlama, {{"lora_dropout", 1.0}}, {}, "lora.lora_dropout = 1.0: expected a value in"},
      {kLlama, {{"lora_dropout", -0.1}}, {}, "lora.lora_dropout = -0.1: expected a value in"},
      {kLlama, {{"lora_dropout", "0.1"}}, {}, "lora.lora_dropout = \"0.1\": expected a number"},
      {kLlama, {{"lora_alpha", -1}}, {}, "lora.lora_alpha = -1"},
      {kLlama, {{"init_lora_weights", "pissa"}}, {}, "lora.init_lora_weights = \"pissa\": expected true, false or"},
      {kLlama, {{"use_rslora", "yes"}}, {}, "lora.use_rslora = \"yes\": expected true or false"},
      {kLlama, {{"rank", 8}}, {}, "unknown key 'lora.rank'"},
      {kLlama, {{"target_modules", {"gate_proj"}}}, {"runtime.tiled_mlp=true"},
       "lora.target_modules 'gate_proj' with runtime.tiled_mlp"},
      {kLlama, {{"from", "/nonexistent/adapter"}}, {}, "lora.from: /nonexistent/adapter/adapter_config.json: cannot open"},
      {kLlama, {{"from", 7}}, {}, "lora.from = 7: expected a string"},
  };
  for (const Row& row : rows) {
    INFO(row.lora.dump() << " " << (row.sets.empty() ? "" : row.sets[0]));
    CHECK_THROWS_WITH(config(row.model, row.lora, row.sets), Catch::Contains(row.expected));
  }
  CHECK_THROWS_WITH(parse_config({{"model", kLlama}, {"lora", 3}}), Catch::Contains("'lora' must be an object"));
  // The accepted forms: PEFT's defaults per family, "all-linear", the tiled MLP with attention targets.
  CHECK(config(kLlama, json::object()).lora.target_modules == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(config(kGpt2, json::object()).lora.target_modules == std::vector<std::string>{"c_attn"});
  CHECK(config(kGpt2, {{"target_modules", "all-linear"}}).lora.target_modules.size() == 3);
  CHECK(config(kLlama, {{"target_modules", {"q_proj"}}}, {"runtime.tiled_mlp=true"}).lora.enabled);
  CHECK(config(kLlama, {{"r", 16}, {"lora_alpha", 32}}).lora.scale() == 2.0);
  // modules_to_save by PEFT's suffix match: "norm" is every norm of the model, "model.norm" the last.
  CHECK(lora_saved_params(config(kLlama, json::object()).model, {"norm"}) ==
        std::vector<std::string>{"model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
                                 "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
                                 "model.norm.weight"});
  CHECK(lora_saved_params(config(kLlama, json::object()).model, {"model.norm"}) == std::vector<std::string>{"model.norm.weight"});
  CHECK(config(kLlama, {{"r", 16}, {"lora_alpha", 32}, {"use_rslora", true}}).lora.scale() == 8.0);
  CHECK_FALSE(parse_config({{"model", kLlama}}).lora.enabled);
  CHECK_FALSE(parse_config({{"model", kLlama}}).resolved.contains("lora"));
}

size_t bytes(const Node* n) {
  size_t b = dtype_size(n->dtype());
  for (const Dim& d : n->shape()) b *= static_cast<size_t>(d.value());
  return b;
}

TEST_CASE("lora: the frozen base has no gradient and no optimizer state", "[lora]") {
  for (const json* model : {&kLlama, &kGpt2}) {
    const bool gpt2 = model == &kGpt2;
    const Config cfg = config(*model, {{"r", 4}, {"target_modules", "all-linear"}, {"modules_to_save", {gpt2 ? "wte" : "model.norm"}}});
    const RankProgram p = build_program(cfg, DType::f64, Stage::joint);
    // The trained tensors, counted from the model's weights: A [r, in] and B [out, r] for each of the
    // layers' projections (GPT-2's c_proj is two modules a layer), and the saved module's.
    size_t want_trained = 0, base_bytes = 0, saved_bytes = 0;
    for (const ParamSpec& s : param_specs(cfg.model)) {
      const size_t n = static_cast<size_t>(shape_numel(s.shape)) * 8;
      base_bytes += n;
      if (s.name == (gpt2 ? "transformer.wte.weight" : "model.norm.weight")) saved_bytes += n;
      const std::string_view m = module_of(s.name);
      const bool in_layer = m.find(".h.") != std::string_view::npos || m.find(".layers.") != std::string_view::npos;
      if (in_layer && s.shape.size() == 2)  // a projection: A [r, in] and B [out, r]
        want_trained += static_cast<size_t>(cfg.lora.r * (s.shape[0] + s.shape[1])) * 8;
    }
    want_trained += saved_bytes;
    INFO((gpt2 ? "gpt2" : "llama"));
    REQUIRE(p.grad_names.size() == p.param_names.size());
    CHECK(p.param_names.size() == adapter_shapes(cfg).size());
    size_t trained = 0, frozen = 0;
    for (Node* n : p.graph->with_role(Role::parameter)) trained += bytes(n);
    for (Node* n : p.graph->with_role(Role::frozen)) {
      frozen += bytes(n);
      CHECK_FALSE(p.graph->find("grad/" + n->name()));
    }
    CHECK(trained == want_trained);
    CHECK(frozen == base_bytes - saved_bytes);
    size_t grads = 0;
    for (const std::string& g : p.grad_names) grads += bytes(p.graph->find(g));
    CHECK(grads == trained);
    // --plan-memory's rule on the trained bytes: AdamW's two moments of the adapters alone.
    const PlannedStateBytes st = planned_state_bytes(p.zero_mode, trained, grads, 1);
    CHECK(st.optimizer == 2 * trained);
    // Mixed precision: the frozen base is a bf16 parameter itself (no f32 master copy, no cast);
    // what trains keeps f32 master weights and gradients.
    const RankProgram mp = build_program(cfg, DType::bf16, Stage::joint);
    for (Node* n : mp.graph->with_role(Role::frozen)) {
      CHECK(n->dtype() == DType::bf16);
      CHECK_FALSE(mp.graph->find(n->name() + ".bf16"));
    }
    for (Node* n : mp.graph->with_role(Role::parameter)) CHECK(n->dtype() == DType::f32);
    for (const std::string& g : mp.grad_names) CHECK(mp.graph->find(g)->dtype() == DType::f32);
  }
}

// The tiled loss's backward computes the head's dw only when the head trains: a frozen head gets
// weight_grad = false and an empty extra output, and the run trains the adapters exactly as
// without the tiled loss.
TEST_CASE("lora: a frozen head costs the tiled loss no weight gradient", "[lora]") {
  for (bool saved : {false, true}) {
    INFO("lm_head " << (saved ? "in modules_to_save" : "frozen"));
    json lora = {{"r", 4}, {"target_modules", "all-linear"}, {"init_lora_weights", false}};
    if (saved) lora["modules_to_save"] = {"lm_head"};
    const Config tiled = config(kLlama, lora, {"runtime.tiled_loss=true", "train.steps=3"});
    const RankProgram p = build_program(tiled, DType::f64, Stage::joint);
    int found = 0;
    for (const auto& n : p.graph->nodes())
      if (n->op() == Op::linear_cross_entropy_backward) {
        ++found;
        CHECK(linear_ce_weight_grad(*n) == saved);
        CHECK(extra_types(*n)[0].shape.size() == (saved ? 2u : 1u));
      }
    CHECK(found == 1);
    TrainArgs args;
    args.quiet = true;
    args.accuracy = false;
    auto single = make_single_process_communicator();
    const TrainResult a = train(tiled, args, *single);
    const TrainResult b = train(config(kLlama, lora, {"runtime.tiled_loss=false", "train.steps=3"}), args, *single);
    REQUIRE(a.params.size() == b.params.size());
    for (const auto& [name, t] : b.params) {
      const std::vector<double> x = a.params.at(name).to_doubles(), y = t.to_doubles();
      for (size_t i = 0; i < x.size(); ++i) REQUIRE(std::abs(x[i] - y[i]) < 1e-12);
    }
  }
}

// The step's FLOPs (the trainer's TFLOP/s and MFU) with a frozen base, counted by hand for a one-layer
// Llama (C 32, 4 heads of 8, 2 K/V heads, MLP 48, vocab 64, untied) with q_proj and v_proj adapters
// at r 4: every counted weight is frozen (4 FLOPs per token: forward and input gradient), the
// adapters train (6 each).
TEST_CASE("lora: the step's FLOPs count no weight gradients for the frozen base", "[lora]") {
  json model = kLlama;
  model["num_hidden_layers"] = 1;
  const Config cfg = config(model, {{"r", 4}, {"target_modules", {"q_proj", "v_proj"}}});
  const int64_t weights = 32 * 32 + 2 * 16 * 32 + 32 * 32 + 3 * 32 * 48 + 2 * 32 + 32 + 64 * 32;  // no embed lookup
  const int64_t adapters = 4 * (32 + 32) + 4 * (32 + 16);
  const LoraFlopParams f = lora_flop_params(cfg.model, cfg.lora.target_modules, cfg.lora.modules_to_save, 4);
  CHECK(f.frozen == weights);
  CHECK(f.adapters == adapters);
  const double attention = 12.0 * 1 * 16 * 16 * 32 * 2 * 0.5;  // B 2, S 16
  CHECK(step_flops(cfg.model, 2, 16, f.frozen, f.adapters) == Approx((4.0 * weights + 6.0 * adapters) * 32 + attention));
  CHECK(step_flops(cfg.model, 2, 16) == Approx(6.0 * weights * 32 + attention));  // full training
  // A saved module trains whole: the final norm's 32 weights cost 6 again.
  const Config saved = config(model, {{"r", 4}, {"target_modules", {"q_proj"}}, {"modules_to_save", {"model.norm"}}});
  CHECK(lora_flop_params(saved.model, saved.lora.target_modules, saved.lora.modules_to_save, 4).frozen == weights - 32);
}

// The loss of `cfg`'s program fed `params` on one fixed batch.
double loss_of(const Config& cfg, const ParamMap& params, Stage stage = Stage::rank_forward) {
  const RankProgram p = build_program(cfg, DType::f64, stage);
  ParamMap feeds = params;
  std::vector<double> ids, labels, pos;
  for (int64_t t = 0; t < 16; ++t) {
    ids.push_back(static_cast<double>((7 * t + 3) % 64));
    labels.push_back(static_cast<double>((7 * t + 10) % 64));
    pos.push_back(static_cast<double>(t));
  }
  feeds["input_ids"] = Tensor::from_vector({1, 16}, ids).to(DType::i64);
  feeds["labels"] = Tensor::from_vector({1, 16}, labels).to(DType::i64);
  feeds["position_ids"] = Tensor::from_vector({1, 16}, pos).to(DType::i64);
  const Executor ex(*p.graph);
  return ex.run(std::move(feeds)).outputs.at(p.loss).to_doubles()[0];
}

TEST_CASE("lora: the adapted model is the base with W + scale·B·A; B = 0 is the base", "[lora]") {
  // Qwen3 (its q/k norms; transformers 4.44, which ref.hf_lora uses, has no Qwen3) and Qwen2 (its
  // q/k/v biases) besides Llama and GPT-2: the base models are checked against the float64
  // reference (tests/ref/torch_models.py) without LoRA, the rewrite against their merged weights here.
  json qwen3_model = kLlama, qwen2_model = kLlama;
  qwen3_model["arch"] = "qwen3";
  qwen2_model["arch"] = "qwen2";
  const json &qwen3 = qwen3_model, &qwen2 = qwen2_model;
  for (const json* model : {&kLlama, &kGpt2, &qwen3, &qwen2}) {
    const Config cfg = config(*model, {{"r", 3}, {"lora_alpha", 5}, {"target_modules", "all-linear"},
                                       {"init_lora_weights", false}});
    const Config base_cfg = parse_config({{"model", *model}, {"data", {{"seq_len", 16}}}});
    ParamMap params = init_params(cfg.model, 1, DType::f64);
    const std::vector<std::string> targets = lora_target_weights(cfg.model, cfg.lora.target_modules);
    ParamMap adapters = init_lora_params(cfg.model, targets, 3, "false", 2, DType::f64);
    ParamMap all = params;
    for (const auto& [n, t] : adapters) all[n] = t;
    const double adapted = loss_of(cfg, all);
    const double merged = loss_of(base_cfg, merge_lora(cfg.model, all, cfg.lora.scale()));
    INFO(model->at("arch") << ": adapted " << adapted << ", merged " << merged << ", base " << loss_of(base_cfg, params));
    CHECK(std::abs(adapted - merged) < 1e-12);
    CHECK(std::abs(adapted - loss_of(base_cfg, params)) > 1e-4);  // the adapters changed the model
    ParamMap zero_b = all;  // PEFT's default init: B = 0
    for (const auto& [n, t] : init_lora_params(cfg.model, targets, 3, "true", 2, DType::f64)) zero_b[n] = t;
    CHECK(loss_of(cfg, zero_b) == loss_of(base_cfg, params));
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

TEST_CASE("lora: adapter directories round-trip, and garbage in them is refused by name", "[lora]") {
  TempDir tmp("lora-adapter");
  const Config cfg = config(kLlama, {{"r", 4}, {"modules_to_save", {"model.norm"}}});
  const std::map<std::string, Shape> shapes = adapter_shapes(cfg);
  CHECK(shapes.size() == 2 * 2 * 2 + 1);  // q_proj and v_proj in 2 layers, A and B; model.norm.weight
  CHECK(shapes.at("model.layers.0.self_attn.v_proj.lora_B.weight") == Shape{16, 4});  // 2 kv heads of 8
  ParamMap params = init_lora_params(cfg.model, lora_target_weights(cfg.model, cfg.lora.target_modules), 4, "false", 3,
                                     DType::f64);
  params["model.norm.weight"] = Tensor::from_vector({32}, std::vector<double>(32, 1.5));
  const std::string dir = tmp.path("adapter");
  std::filesystem::create_directories(dir);
  save_adapter(dir, params, cfg);
  const SafetensorsFile file = load_safetensors(dir + "/adapter_model.safetensors");
  CHECK(file.tensors.count("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight") == 1);
  CHECK(file.tensors.count("base_model.model.model.norm.weight") == 1);
  CHECK(file.metadata.at("format") == "pt");
  const ParamMap back = load_adapter(dir, cfg, DType::f64);
  REQUIRE(back.size() == params.size());
  for (const auto& [n, t] : params) CHECK(back.at(n).to_doubles() == t.to_doubles());
  // lora.from fills the keys the section leaves out from adapter_config.json.
  const Config from = config(kLlama, {{"from", dir}});
  CHECK(from.lora.r == 4);
  CHECK(from.lora.modules_to_save == std::vector<std::string>{"model.norm"});

  auto refused = [&](const std::string& expected) {
    CHECK_THROWS_WITH(load_adapter(dir, cfg, DType::f64), Catch::Contains(expected));
    save_adapter(dir, params, cfg);  // whole again for the next row
  };
  write_text(dir + "/adapter_config.json", "{not json");
  refused("adapter_config.json: not valid JSON");
  write_text(dir + "/adapter_config.json", R"({"peft_type": "PREFIX_TUNING"})");
  refused("adapter_config.json: peft_type \"PREFIX_TUNING\": expected \"LORA\"");
  for (const auto& [key, value, expected] :
       std::vector<std::tuple<std::string, json, std::string>>{
           {"use_dora", true, "use_dora true: DoRA adapters are not supported"},
           {"alpha_pattern", {{"q_proj", 16}}, "alpha_pattern {\"q_proj\":16}: per-module ranks and alphas"},
           {"layers_to_transform", {0}, "layers_to_transform [0]: not supported"},
           // PEFT settings that change the math (its LoraConfig, 0.14 to 0.20): refused naming the
           // key, the value and why, not later as a foreign or missing tensor.
           {"lora_bias", true, "lora_bias true: lora_B has a bias"},
           {"init_lora_weights", "pissa", "init_lora_weights \"pissa\": PEFT trains this adapter on the residual base"},
           {"init_lora_weights", "pissa_niter_4", "init_lora_weights \"pissa_niter_4\": PEFT trains this adapter on the residual"},
           {"init_lora_weights", "olora", "init_lora_weights \"olora\": PEFT trains this adapter on the residual base"},
           {"init_lora_weights", "corda", "init_lora_weights \"corda\": PEFT trains this adapter on the residual base"},
           {"init_lora_weights", "loftq", "init_lora_weights \"loftq\": LoftQ trains the adapter on a quantised base"},
           {"init_lora_weights", "kaiming", "init_lora_weights \"kaiming\": not an initialisation autosp knows"},
           {"init_lora_weights", 3, "init_lora_weights 3: expected true, false or a method's name"},
           {"trainable_token_indices", {1, 2}, "trainable_token_indices [1,2]: PEFT then also trains single rows"},
           {"trainable_token_indices", {{"embed_tokens", {1}}}, "trainable_token_indices {\"embed_tokens\":[1]}"},
           {"target_parameters", {"mlp.experts.gate_up_proj"}, "target_parameters [\"mlp.experts.gate_up_proj\"]: LoRA on nn.Parameter"},
           {"alora_invocation_tokens", {5, 6}, "alora_invocation_tokens [5,6]: an activated LoRA"},
           {"use_qalora", true, "use_qalora true: QALoRA"},
           {"target_modules", ".*q_proj", "target_modules \".*q_proj\": PEFT's regex form is not supported"},
           // exclude_modules, matched as PEFT's check_target_module_exists does: a listed name equals
           // the module's path or is a suffix of it after a "."; the regex string form is refused.
           {"exclude_modules", {"q_proj"}, "exclude_modules [\"q_proj\"]: excludes model.layers.0.self_attn.q_proj and 1 more of target_modules"},
           {"exclude_modules", {"layers.1.self_attn.v_proj"}, "exclude_modules [\"layers.1.self_attn.v_proj\"]: excludes model.layers.1.self_attn.v_proj of target_modules"},
           {"exclude_modules", {"model.layers.0.self_attn.v_proj", "lm_head"}, "excludes model.layers.0.self_attn.v_proj of"},
           {"exclude_modules", ".*layers\\.0.*", "exclude_modules \".*layers\\\\.0.*\": PEFT's regex form is not supported"},
           {"exclude_modules", {1}, "exclude_modules [1]: expected a list of module names"}}) {
    std::ifstream in(dir + "/adapter_config.json");
    json a = json::parse(in);
    a[key] = value;
    write_text(dir + "/adapter_config.json", a.dump());
    refused(expected);
  }
  // What does not change this adapter's math is accepted: exclusions that match none of the targets
  // (PEFT's suffix match is by whole dotted components: "proj" and "self_attn" name no q/v_proj;
  // "lm_head" is no target), PEFT's "not given" values, initialisations that leave the base as it
  // is, and unknown keys (a warning, as PEFT warns).
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"exclude_modules", {"proj"}},
           {"exclude_modules", {"self_attn", "lm_head", "layers.0.self_attn.k_proj", "_proj"}},
           {"exclude_modules", json::array()},
           {"exclude_modules", ""},
           {"exclude_modules", nullptr},
           {"lora_bias", false},
           {"trainable_token_indices", nullptr},
           {"target_parameters", json::array()},
           {"init_lora_weights", "gaussian"},
           {"init_lora_weights", "eva"},
           {"init_lora_weights", "orthogonal"},
           {"init_lora_weights", false},
           {"lora_alpah", 16}}) {
    std::ifstream in(dir + "/adapter_config.json");
    json a = json::parse(in);
    a[key] = value;
    write_text(dir + "/adapter_config.json", a.dump());
    INFO(key << " " << value.dump());
    CHECK_NOTHROW(load_adapter(dir, cfg, DType::f64));
    save_adapter(dir, params, cfg);
  }
  save_adapter(dir, params, config(kLlama, {{"r", 8}, {"modules_to_save", {"model.norm"}}}));
  refused("adapter_config.json: r 8 differs from the run's lora.r 4");
  {  // another base: a model directory of another width
    const std::string base = tmp.path("other-base");
    std::filesystem::create_directories(base);
    write_text(base + "/config.json", R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 48,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48})");
    std::ifstream in(dir + "/adapter_config.json");
    json a = json::parse(in);
    a["base_model_name_or_path"] = base;
    write_text(dir + "/adapter_config.json", a.dump());
    refused("has hidden_size 48, the run's model 32: the adapter was trained on another base");
  }
  ParamMap bad = params;
  bad["model.layers.0.mlp.up_proj.lora_A.weight"] = Tensor::zeros({4, 32}, DType::f64);
  save_adapter(dir, bad, cfg);
  refused("'base_model.model.model.layers.0.mlp.up_proj.lora_A.weight' is not a tensor this run trains");
  bad = params;
  bad.erase("model.norm.weight");
  save_adapter(dir, bad, cfg);
  refused("missing 'base_model.model.model.norm.weight'");
  bad = params;
  bad["model.layers.0.self_attn.q_proj.lora_A.weight"] = Tensor::zeros({8, 32}, DType::f64);
  save_adapter(dir, bad, cfg);
  refused("'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has shape [8, 32], the run's model needs [4, 32]");
  write_text(dir + "/adapter_model.safetensors", "garbage");
  refused("adapter_model.safetensors");
}

TEST_CASE("lora: a resumed LoRA run continues exactly; a checkpoint of the other kind is refused", "[lora]") {
  TempDir tmp("lora-resume");
  const json lora = {{"r", 2}, {"target_modules", {"q_proj", "down_proj"}}, {"modules_to_save", {"model.norm"}},
                     {"init_lora_weights", false}};
  Config cfg = parse_config({{"model", kLlama}, {"data", {{"source", "synthetic"}, {"seq_len", 16}, {"batch_size", 2}}},
                             {"train", {{"steps", 6}, {"warmup_steps", 1}, {"checkpoint_every", 3}, {"log_every", 100},
                                        {"checkpoint_dir", tmp.path("ckpt")}}},
                             {"runtime", {{"threads", 1}}}, {"lora", lora}});
  auto world = make_single_process_communicator();
  TrainArgs ta;
  ta.quiet = true;
  const TrainResult full = train(cfg, ta, *world);
  REQUIRE(full.steps.size() == 6);
  size_t trained = 0;  // the measured state: AdamW moments of the adapters and model.norm only
  for (const auto& [name, t] : full.params) trained += static_cast<size_t>(t.numel()) * 4;
  CHECK(full.params.size() == 2 * 2 * 2 + 1);
  CHECK(full.optimizer_state_bytes == 2 * trained);
  const std::string step3 = tmp.path("ckpt/step_00000003");
  CHECK(std::filesystem::exists(step3 + "/adapter_model.safetensors"));
  CHECK_FALSE(std::filesystem::exists(step3 + "/model.safetensors"));
  TrainArgs resume = ta;
  resume.resume = step3;
  Config again = cfg;
  again.train.checkpoint_dir = tmp.path("ckpt2");
  const TrainResult tail = train(again, resume, *world);
  REQUIRE(tail.steps.size() == 3);
  for (size_t k = 0; k < 3; ++k) CHECK(tail.steps[k].loss == full.steps[k + 3].loss);
  REQUIRE(tail.params.size() == full.params.size());
  for (const auto& [name, p] : full.params) CHECK(p.to_doubles() == tail.params.at(name).to_doubles());

  Config plain = cfg;  // the same run without the lora section
  plain = parse_config(json{{"model", kLlama}, {"data", {{"seq_len", 16}, {"batch_size", 2}}}});
  CHECK_THROWS_WITH(load_checkpoint(step3, plain, DType::f32), Catch::Contains("holds LoRA adapters"));
  CHECK_THROWS_WITH(load_checkpoint(step3, parse_config(json{{"model", kLlama}, {"data", {{"seq_len", 16}}},
                                                             {"lora", {{"r", 4}}}}),
                                    DType::f32),
                    Catch::Contains("adapter_config.json: r 2 differs from the run's lora.r 4"));
}

TEST_CASE("lora: the base's record tells bases apart, and a resume on another base is refused", "[lora]") {
  const Config cfg = config(kLlama, {{"r", 2}});
  const ParamMap base = init_params(cfg.model, 1, DType::f32);
  const json rec = lora_base_record(cfg, "", base);
  CHECK(rec["source"] == "random");
  CHECK(rec["seed"] == cfg.train.seed);
  CHECK(rec["tensors"] == base.size());
  // The same values in f64 (another runtime.dtype's master copy) are the same base.
  ParamMap wide;
  for (const auto& [n, t] : base) wide[n] = t.to(DType::f64);
  CHECK(lora_base_record(cfg, "", wide)["fingerprint"] == rec["fingerprint"]);
  // Another seed, or one element changed (the first and the last are always sampled), is another base.
  CHECK(lora_base_record(cfg, "", init_params(cfg.model, 2, DType::f32))["fingerprint"] != rec["fingerprint"]);
  for (bool last : {false, true}) {
    ParamMap edited;
    for (const auto& [n, t] : base) edited[n] = t.clone();
    Tensor& w = edited.at("model.layers.1.mlp.down_proj.weight");
    w.data<float>()[last ? w.numel() - 1 : 0] += 1e-3f;
    CHECK(lora_base_record(cfg, "", edited)["fingerprint"] != rec["fingerprint"]);
  }
  CHECK(check_lora_base(rec, rec, "m.json").empty());
  json from_a = rec, from_b = rec;
  from_a["source"] = from_b["source"] = "model.from";
  from_a["path"] = "/models/a";
  from_b["path"] = "/models/b";
  from_a.erase("seed");
  from_b.erase("seed");
  CHECK(check_lora_base(from_a, from_b, "m.json") ==
        "lora: the base model.from \"/models/b\" has the weights the checkpoint's adapters were trained on (the "
        "base model.from \"/models/a\", fingerprint " + rec["fingerprint"].get<std::string>() + ")");
  json other = from_b;
  other["fingerprint"] = "00000000";
  CHECK_THROWS_WITH(check_lora_base(from_a, other, "m.json"),
                    Catch::Contains("m.json: the adapters were trained on the base model.from \"/models/a\"") &&
                        Catch::Contains("this run's base, model.from \"/models/b\", holds other weights") &&
                        Catch::Contains("set model.from \"/models/a\" to continue that run"));
  json random = rec;
  random["fingerprint"] = "00000000";
  CHECK_THROWS_WITH(check_lora_base(from_a, random, "m.json"),
                    Catch::Contains("this run has no model.from (its base would be randomly initialised): model.from "
                                    "must give that base"));
  CHECK_THROWS_WITH(check_lora_base(rec, other, "m.json"),
                    Catch::Contains("trained on a randomly initialised base (no model.from; train.seed") &&
                        Catch::Contains("resume without model.from"));
  CHECK_THROWS_WITH(check_lora_base(json("x"), rec, "m.json"), Catch::Contains("m.json: 'lora_base' is not a record"));
}

}  // namespace
}  // namespace autosp::test
