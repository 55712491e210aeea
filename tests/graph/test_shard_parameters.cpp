// ZeRO-3's passes (graph/passes/shard_parameters.h) in whole rank programs: golden IR of the joint
// graph, and the properties the memory bound rests on, checked on the graph by names and
// positions (not through ParameterUnits):
//   - every parameter is fed as its shard, [ceil(numel / W)], and gathered before it is read;
//   - a layer's forward gathers are prefetched exactly one layer early: nodes of the layer before
//     run between a gather and its first reader, and none of the layer before that;
//   - no gather is read by both the forward and the backward, and each layer's backward reads its
//     own gathers;
//   - every gradient is reduce-scattered right after the node that completes it;
//   - at stages 0-2, or on one rank, nothing of it appears.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "common/golden.h"
#include "config/config.h"
#include "compiler/program.h"
#include "graph/autograd.h"
#include "graph/passes/shard_parameters.h"
#include "graph/printer.h"
#include "models/model.h"

namespace autosp {
namespace {

using autosp::testing::check_golden;
using nlohmann::json;

Config zero3_config(const std::string& arch, int64_t layers, int64_t sp, int64_t stage, bool checkpointing = false,
                    const std::string& dtype = "float32") {
  json model = {{"arch", arch}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", layers},
                {"num_attention_heads", 4}};
  if (arch == "llama") model.update({{"num_key_value_heads", 2}, {"intermediate_size", 48}});
  else model["max_position_embeddings"] = 64;
  return parse_config({{"model", model},
                       {"data", {{"source", "synthetic"}, {"seq_len", 16}, {"batch_size", 1}}},
                       {"runtime", {{"activation_checkpointing", checkpointing}, {"dtype", dtype}}},
                       {"sequence_parallel", {{"autosp_size", sp}}},
                       {"zero_optimization", {{"stage", stage}}}});
}

RankProgram joint(const Config& cfg, int world, int rank) {
  return build_program(cfg, cfg.runtime.dtype, Stage::joint,
                       rank_layout(world, rank, cfg.sequence_parallel.autosp_size));
}

// The layer a node belongs to by its name ("h3.qkv", "d.l1.attn", "l2.mlp.re"), or -1.
int layer_of(const Node& n, char prefix) {
  std::string_view name = n.name();
  if (name.starts_with("d.")) name.remove_prefix(2);
  if (name.size() < 3 || name[0] != prefix || name[1] < '0' || name[1] > '9') return -1;
  const size_t dot = name.find('.');
  return dot == std::string_view::npos ? -1 : std::stoi(std::string(name.substr(1, dot - 1)));
}

// The layer of a parameter by its Hugging Face name ("transformer.h.3.", "model.layers.1."), or -1.
int param_layer(const std::string& name) {
  for (const std::string key : {".h.", ".layers."}) {
    const size_t at = name.find(key);
    if (at != std::string::npos) return std::stoi(name.substr(at + key.size()));
  }
  return -1;
}

}  // namespace

TEST_CASE("ZeRO-3 joint programs match their golden IR", "[zero3][golden]") {
  check_golden("zero3/gpt2-w2-sp2r1.txt", to_text(*joint(zero3_config("gpt2", 2, 2, 3), 2, 1).graph));
  check_golden("zero3/llama-w4-sp2r2-bf16-checkpointed.txt",
               to_text(*joint(zero3_config("llama", 2, 2, 3, true, "bfloat16"), 4, 2).graph));
}

TEST_CASE("ZeRO-3 shards every parameter, prefetches a layer early and gathers again for the backward",
          "[zero3]") {
  for (const auto& [arch, checkpointing] : {std::pair{std::string("gpt2"), false}, {std::string("llama"), false},
                                            {std::string("llama"), true}}) {
    const int W = 4;
    const Config cfg = zero3_config(arch, 4, 2, 3, checkpointing);
    const RankProgram p = joint(cfg, W, 3);
    const Graph& g = *p.graph;
    const char prefix = arch == "gpt2" ? 'h' : 'l';
    const size_t backward = backward_begin(g);
    INFO(arch << (checkpointing ? ", checkpointed" : ""));
    REQUIRE(backward < g.size());
    const Config whole_cfg = zero3_config(arch, 4, 2, 0);
    const RankProgram whole = joint(whole_cfg, W, 3);
    for (Node* param : whole.graph->with_role(Role::parameter)) {
      const Node* shard = g.find(param->name());
      REQUIRE(shard);
      int64_t numel = 1;
      for (const Dim& d : param->shape()) numel *= d.value();
      CHECK(shard->type() == TensorType{DType::f32, {Dim((numel + W - 1) / W)}});
      // Only gathers read the shard, one per pass at least.
      REQUIRE(!shard->users().empty());
      bool forward = false, backward_reads = false;
      for (const Node* gather : shard->users()) {
        REQUIRE(gather->op() == Op::all_gather);
        CHECK(gather->shape() == param->shape());
        bool in_fwd = false, in_bwd = false;
        for (const Node* u : gather->users()) (g.position(u) < backward ? in_fwd : in_bwd) = true;
        // One copy serves forward and backward only outside the layers (the final norm and the
        // LM head: the forward's last unit and the backward's first share it).
        CHECK((!(in_fwd && in_bwd) || param_layer(param->name()) < 0));
        forward |= in_fwd;
        backward_reads |= in_bwd;
        // The prefetch: between the gather and its first reader run nodes of the layer before
        // the reader's, and none of two layers before.
        size_t first = g.size();
        for (const Node* u : gather->users()) first = std::min(first, g.position(u));
        const int reader = layer_of(*g.nodes()[first], prefix);
        const int layer = param_layer(param->name());
        if (!in_fwd || layer < 1 || reader != layer) continue;
        int before = 0, two_before = 0;
        for (size_t i = g.position(gather); i < first; ++i) {
          const Node& n = *g.nodes()[i];
          if (n.op() == Op::output) continue;
          before += layer_of(n, prefix) == layer - 1;
          two_before += layer >= 2 && layer_of(n, prefix) == layer - 2;
        }
        INFO(param->name() << " gathered at " << g.position(gather) << ", first read at " << first << " by "
                           << g.nodes()[first]->name());
        CHECK(before > 0);
        CHECK(two_before == 0);
      }
      CHECK(forward);
      // Matmul weights and norm weights are read by the backward too; embedding tables are not
      // (GPT-2's tied one is, as the head).
      if (param->shape().size() == 2 && param->name().find("embed_tokens") == std::string::npos &&
          param->name().find("wpe") == std::string::npos)
        CHECK(backward_reads);
    }
    // Each gradient is reduce-scattered right after the node that completes it.
    size_t scatters = 0;
    for (const auto& n : g.nodes()) {
      if (n->op() != Op::reduce_scatter) continue;
      ++scatters;
      CHECK(g.position(n.get()) == g.position(n->input(0)) + 1);
      CHECK(g.is_output(n.get()));
    }
    CHECK(scatters == p.grad_names.size());
  }
}

TEST_CASE("ZeRO-3 under bf16 sums each bf16 gradient in f32 without a whole f32 copy", "[zero3]") {
  for (bool checkpointing : {false, true}) {
    INFO((checkpointing ? "checkpointed" : "not checkpointed"));
    const RankProgram p = joint(zero3_config("llama", 2, 2, 3, checkpointing, "bfloat16"), 4, 1);
    const Graph& g = *p.graph;
    size_t scatters = 0;
    for (const auto& n : g.nodes()) {
      if (n->op() != Op::reduce_scatter) continue;
      ++scatters;
      INFO(n->name());
      // reduce_scatter(dW bf16, sum_dtype f32) → the f32 shard: no cast of the whole gradient.
      CHECK(n->input(0)->dtype() == DType::bf16);
      CHECK(n->input(0)->op() != Op::cast);
      CHECK(n->attrs().s("sum_dtype") == "f32");
      CHECK(n->dtype() == DType::f32);
      CHECK(n->role() == Role::gradient);
      CHECK(g.is_output(n.get()));
    }
    CHECK(scatters == p.grad_names.size());
  }
}

TEST_CASE("ZeRO stages 0-2, and stage 3 on one rank, leave the program without parameter collectives", "[zero3]") {
  auto count = [](const Graph& g) {
    size_t n = 0;
    for (const auto& node : g.nodes()) n += node->op() == Op::all_gather || node->op() == Op::reduce_scatter;
    return n;
  };
  for (int64_t stage : {0, 1, 2}) CHECK(count(*joint(zero3_config("llama", 2, 2, stage), 2, 0).graph) == 0);
  CHECK(count(*joint(zero3_config("llama", 2, 1, 3), 1, 0).graph) == 0);
  CHECK(count(*joint(zero3_config("llama", 2, 1, 3), 2, 0).graph) > 0);
}

// ParameterUnits finds a node's unit by the node's id (its position when the units were taken):
// inserts, moves and erasures after that leave every unit where it was, and a node made after, or
// renumbered by reading the order again, is refused rather than given another node's unit.
TEST_CASE("ZeRO-3's units keep each node's unit through edits and refuse later nodes", "[zero3]") {
  const Config cfg = zero3_config("llama", 3, 2, 3);
  RankProgram p = build_program(cfg, DType::f32, "autograd", rank_layout(2, 0, 2));
  Graph& g = *p.graph;
  PassContext ctx;
  ctx.layer_scopes = layer_scopes(cfg.model);
  const ParameterUnits units(g, ctx);
  std::vector<Node*> nodes;
  std::vector<int> before;
  for (const auto& n : g.nodes()) {
    nodes.push_back(n.get());
    before.push_back(units.unit_of(n.get()));
  }
  REQUIRE(before.back() > 4);  // the forward's and the backward's layers
  // Edits in the middle: a node inserted after every 7th from a parameter, one erased again, a leaf moved.
  Node* x = g.with_role(Role::parameter).at(0);
  std::vector<Node*> made;
  for (size_t i = g.position(x); i + 1 < nodes.size(); i += 7)
    made.push_back(g.insert_after(nodes[i], Op::scale, {x}, {{"factor", 2.0}}, "extra"));
  g.erase(made.back());
  made.pop_back();
  g.move_before(g.with_role(Role::parameter).back(), nodes.front());  // a leaf: its users come later
  for (size_t i = 0; i < nodes.size(); ++i) REQUIRE(units.unit_of(nodes[i]) == before[i]);
  for (Node* m : made) CHECK_THROWS(units.unit_of(m));
  (void)g.nodes();  // renumbers: every node after the first insert has another id now
  CHECK_THROWS(units.unit_of(nodes.back()));
}

}  // namespace autosp
