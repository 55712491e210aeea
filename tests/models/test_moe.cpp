// The mixtures of experts' model side (models/moe.h, the family rows, the model keys): which layers
// are sparse (transformers' rule, written out here), the parameters a sparse layer has, and the
// bad input each path refuses with a message naming the key or the tensor: k above the experts,
// a layer index past the last, the aux-loss switch with DPO or a bad coefficient, a router with
// jitter noise in a config.json, and an expert tensor missing or misshaped in a weights file; and
// the load-balancing loss's graph: its terms, outputs and reduction over the SP group
// (its values and gradients against transformers: tests/ref/hf_moe_aux.py).
#include <catch2/catch.hpp>

#include <fstream>
#include <set>

#include "common/temp_dir.h"
#include "compiler/program.h"
#include "config/config.h"
#include "models/hf_config.h"
#include "models/flops.h"
#include "models/model.h"
#include "models/moe.h"
#include "models/weights.h"
#include "tensor/safetensors.h"

using namespace autosp;
using json = nlohmann::json;

namespace {

json moe_model(const char* arch, json more = json::object()) {
  json m = {{"arch", arch}, {"vocab_size", 32}, {"hidden_size", 16}, {"num_hidden_layers", 4},
            {"num_attention_heads", 2}, {"num_key_value_heads", 2}, {"intermediate_size", 24},
            {"max_position_embeddings", 64}};
  m.update(more);
  return m;
}

Config parse(const json& model) { return parse_config({{"model", model}, {"data", {{"seq_len", 8}}}}); }

std::set<std::string> names_of(const ModelConfig& m) {
  std::set<std::string> out;
  for (const ParamSpec& p : param_specs(m)) out.insert(p.name);
  return out;
}

}  // namespace

TEST_CASE("sparse layers follow transformers' Qwen2MoeDecoderLayer rule", "[models][moe]") {
  const Config c = parse(moe_model("qwen2_moe", {{"num_experts", 3}, {"moe_intermediate_size", 8},
                                                 {"shared_expert_intermediate_size", 12}, {"decoder_sparse_step", 2},
                                                 {"mlp_only_layers", {3}}}));
  const std::set<std::string> names = names_of(c.model);
  for (int64_t l = 0; l < 4; ++l) {
    INFO("layer " << l);
    // (layer_idx not in mlp_only_layers) and (layer_idx + 1) % decoder_sparse_step == 0
    const bool sparse = l != 3 && (l + 1) % 2 == 0;
    const std::string h = "model.layers." + std::to_string(l) + ".";
    CHECK(names.count(h + "mlp.gate.weight") == (sparse ? 1u : 0u));
    CHECK(names.count(h + "mlp.experts.2.down_proj.weight") == (sparse ? 1u : 0u));
    CHECK(names.count(h + "mlp.shared_expert_gate.weight") == (sparse ? 1u : 0u));
    CHECK(names.count(h + "mlp.gate_proj.weight") == (sparse ? 0u : 1u));
  }
  for (const ParamSpec& p : param_specs(c.model)) {
    if (p.name == "model.layers.1.mlp.experts.0.gate_proj.weight") CHECK(p.shape == Shape{8, 16});
    if (p.name == "model.layers.1.mlp.experts.0.down_proj.weight") CHECK(p.shape == Shape{16, 8});
    if (p.name == "model.layers.1.mlp.shared_expert.up_proj.weight") CHECK(p.shape == Shape{12, 16});
    if (p.name == "model.layers.1.mlp.gate.weight") CHECK(p.shape == Shape{3, 16});
  }
  // Mixtral: every layer sparse, experts w1 (gate), w3 (up), w2 (down) of intermediate_size.
  const Config mx = parse(moe_model("mixtral", {{"num_local_experts", 3}}));
  for (const ParamSpec& p : param_specs(mx.model))
    if (p.name == "model.layers.3.block_sparse_moe.experts.2.w2.weight") CHECK(p.shape == Shape{16, 24});
  CHECK(names_of(mx.model).count("model.layers.0.block_sparse_moe.gate.weight") == 1);
}

TEST_CASE("mixture-of-experts settings that cannot work are named errors", "[models][moe][config]") {
  CHECK_THROWS_WITH(parse(moe_model("mixtral", {{"num_local_experts", 2}, {"num_experts_per_tok", 3}})),
                    Catch::Contains("model.num_experts_per_tok 3 exceeds model.num_local_experts 2"));
  CHECK_THROWS_WITH(parse(moe_model("qwen3_moe", {{"num_experts", 4}, {"num_experts_per_tok", 5}})),
                    Catch::Contains("model.num_experts_per_tok 5 exceeds model.num_experts 4"));
  CHECK_THROWS_WITH(parse(moe_model("qwen2_moe", {{"mlp_only_layers", {4}}})),
                    Catch::Contains("model.mlp_only_layers names layer 4"));
  CHECK_THROWS_WITH(parse(moe_model("qwen2_moe", {{"mlp_only_layers", {"x"}}})),
                    Catch::Contains("model.mlp_only_layers") && Catch::Contains("not a layer index"));
  CHECK_THROWS_WITH(parse(moe_model("qwen2_moe", {{"mlp_only_layers", {-1}}})), Catch::Contains("not a layer index"));
  CHECK_THROWS_WITH(parse(moe_model("qwen2_moe", {{"mlp_only_layers", 3}})), Catch::Contains("model.mlp_only_layers"));
  CHECK_THROWS_WITH(parse(moe_model("qwen2_moe", {{"num_experts", 0}})), Catch::Contains("model.num_experts"));
  // The load-balancing loss: not with DPO; a coefficient that is no number or negative.
  CHECK_THROWS_WITH(parse_config({{"model", moe_model("mixtral", {{"output_router_logits", true}})},
                                  {"data", {{"seq_len", 8}}}, {"train", {{"objective", "dpo"}}}}),
                    Catch::Contains("model.output_router_logits") && Catch::Contains("\"dpo\""));
  CHECK_THROWS_WITH(parse(moe_model("mixtral", {{"output_router_logits", true}, {"router_aux_loss_coef", -1}})),
                    Catch::Contains("model.router_aux_loss_coef"));
  CHECK_THROWS_WITH(parse(moe_model("qwen3_moe", {{"output_router_logits", "yes"}})),
                    Catch::Contains("model.output_router_logits"));
  CHECK_THROWS_WITH(parse(moe_model("qwen3_moe", {{"router_aux_loss_coef", "big"}})),
                    Catch::Contains("model.router_aux_loss_coef"));
  // A key of another family.
  CHECK_THROWS_WITH(parse(moe_model("mixtral", {{"num_experts", 4}})), Catch::Contains("model.num_experts"));
  // config.json: Mixtral's router jitter noise, and a k larger than the experts (through model.from's keys).
  CHECK_THROWS_WITH(translate_hf_config({{"model_type", "mixtral"}, {"router_jitter_noise", 0.1}}, "c.json"),
                    Catch::Contains("router_jitter_noise"));
  CHECK_THROWS_WITH(translate_hf_config({{"model_type", "qwen2_moe"}, {"mlp_only_layers", {"a"}}}, "c.json"),
                    Catch::Contains("mlp_only_layers"));
  const json hf = {{"model_type", "qwen3_moe"}, {"num_experts", 4}, {"num_experts_per_tok", 8}};
  CHECK_THROWS_WITH(parse(translate_hf_config(hf, "c.json").model), Catch::Contains("model.num_experts_per_tok 8"));
}

TEST_CASE("a weights file without an expert's tensor, or with one misshaped, is a named error", "[models][moe]") {
  const test::TempDir tmp("moe-weights");
  const ModelConfig m = parse(moe_model("mixtral", {{"num_local_experts", 3}, {"num_hidden_layers", 1}})).model;
  ParamMap good = init_params(m, 1, DType::f32);
  const std::string path = (tmp.dir / "w.safetensors").string();
  const std::string w2 = "model.layers.0.block_sparse_moe.experts.1.w2.weight";
  ParamMap missing = good;
  missing.erase(w2);
  save_safetensors(path, missing);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("missing tensor '" + w2 + "'"));
  ParamMap wrong = good;
  wrong[w2] = Tensor::zeros({24, 16}, DType::f32);  // [I, C] where [C, I] belongs
  save_safetensors(path, wrong);
  CHECK_THROWS_WITH(load_weights(path, m, DType::f32), Catch::Contains("[24, 16]") && Catch::Contains("[16, 24]"));
  save_safetensors(path, good);
  CHECK(load_weights(path, m, DType::f32).size() == good.size());
}

TEST_CASE("Qwen3-30B-A3B's config.json has its 30.5 B parameters, 3.35 B of them active", "[models][moe][scaling]") {
  std::ifstream f(std::string(AUTOSP_SOURCE_DIR) + "/configs/hf/qwen3-30b-a3b.json");
  const ModelConfig m = parse(translate_hf_config(json::parse(f), "qwen3-30b-a3b.json").model).model;
  // Per layer: q, o 2048·4096; k, v 2048·512; norms 2·2048 + q/k norms 2·128; router 128·2048;
  // 128 experts of 3·2048·768. Embedding and untied head 151936·2048 each, final norm 2048.
  const int64_t attn = 2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 2048 + 2 * 128, expert = 3 * 2048 * 768;
  const int64_t outer = 2 * int64_t(151936) * 2048 + 2048;
  CHECK(param_count(m) == outer + 48 * (attn + 128 * 2048 + 128 * expert));
  CHECK(param_count(m) == 30532122624);
  // FLOPs count the head, not the embedding lookup, and 8 experts per token.
  CHECK(flop_param_count(m) == outer - int64_t(151936) * 2048 + 48 * (attn + 128 * 2048 + 8 * expert));
}

namespace {

const Node* only(const Graph& g, Op op) {
  const Node* found = nullptr;
  for (const auto& n : g.nodes())
    if (n->op() == op) {
      REQUIRE(found == nullptr);
      found = n.get();
    }
  REQUIRE(found != nullptr);
  return found;
}

}  // namespace

TEST_CASE("output_router_logits adds the load-balancing loss to training graphs", "[models][moe][graph]") {
  // Qwen2-MoE with layer 1 dense: three MoE layers of 3 experts, top-2.
  json model = moe_model("qwen2_moe", {{"num_experts", 3}, {"moe_intermediate_size", 8},
                                       {"shared_expert_intermediate_size", 12}, {"mlp_only_layers", {1}},
                                       {"output_router_logits", true}, {"router_aux_loss_coef", 0.25}});
  const Config cfg = parse(model);
  CHECK(cfg.notes.empty());
  const RankProgram p = build_program(cfg, DType::f32, Stage::joint);
  const Graph& g = *p.graph;
  const Node* aux = only(g, Op::moe_aux_loss);
  CHECK(aux->attrs().i("top_k") == 2);
  CHECK(aux->attrs().f("share") == 1.0);
  CHECK(aux->input(0)->name() == "router_stats");
  CHECK(aux->input(0)->type().str() == "f32[3, 2, 3]");
  const Node* loss = g.with_role(Role::loss)[0];
  REQUIRE(loss->op() == Op::add);
  CHECK(loss->input(0)->name() == "lm_loss");
  CHECK(loss->input(1)->op() == Op::scale);
  CHECK(loss->input(1)->attrs().f("factor") == 0.25);
  CHECK(p.aux_loss == "aux_loss");
  CHECK(p.router_stats == "router_stats");
  int stats = 0;
  for (const auto& n : g.nodes()) stats += n->op() == Op::moe_router_stats;
  CHECK(stats == 3);
  // Validation's program (forward only) has the LM loss alone; so has a run without the switch.
  CHECK(build_program(cfg, DType::f32, Stage::rank_forward).aux_loss.empty());
  model["output_router_logits"] = false;
  CHECK(build_program(parse(model), DType::f32, Stage::joint).aux_loss.empty());
  // A zero coefficient is fine, and said.
  model["output_router_logits"] = true;
  model["router_aux_loss_coef"] = 0;
  const Config zero = parse(model);
  REQUIRE(zero.notes.size() == 1);
  CHECK_THAT(zero.notes[0], Catch::Contains("router_aux_loss_coef 0") && Catch::Contains("logged"));
}

TEST_CASE("under SP the router statistics are summed over the group before the loss", "[models][moe][graph]") {
  Config cfg = parse(moe_model("mixtral", {{"num_local_experts", 4}, {"output_router_logits", true}}));
  cfg.sequence_parallel.autosp_size = 2;
  cfg.train.gradient_accumulation_steps = 3;
  // dp 2 x sp 2 with 3 micro-batches: each term is 1/(4 · 3) of the group's loss.
  const RankProgram p = build_program(cfg, DType::f32, Stage::joint, rank_layout(4, 1, 2));
  const Graph& g = *p.graph;
  const Node* aux = only(g, Op::moe_aux_loss);
  CHECK(aux->attrs().f("share") == Approx(1.0 / 12));
  REQUIRE(aux->input(0)->op() == Op::all_reduce);
  CHECK(aux->input(0)->attrs().s("group") == "sp");
  CHECK(aux->input(0)->input(0)->name() == "router_stats");
  CHECK(p.aux_loss == "aux_loss.global");
  CHECK(p.router_stats == "router_stats.global");
  CHECK(g.find("router_stats.global")->attrs().s("group") == "world");
  // The router's gradient reaches every layer's probabilities through the statistics' all-reduce.
  int stats_grads = 0;
  for (const auto& n : g.nodes()) stats_grads += n->op() == Op::moe_aux_loss_backward;
  CHECK(stats_grads == 1);
}
