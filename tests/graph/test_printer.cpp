// Printers: golden text for both model graphs (tests/golden/*.txt; set AUTOSP_UPDATE_GOLDEN=1 to
// rewrite them after a deliberate change, then review the diff), the json contract, and dot.
#include <catch2/catch.hpp>


#include "graph/builder.h"
#include "common/golden.h"
#include "graph/printer.h"
#include "models/model.h"

using namespace autosp;
using autosp::testing::check_golden;

namespace {


ModelConfig tiny(const std::string& arch) {
  ModelConfig m;
  m.arch = arch == "llama" ? Arch::llama : Arch::gpt2;
  m.vocab_size = 64;
  m.hidden_size = 32;
  m.num_hidden_layers = 1;
  m.num_attention_heads = 4;
  m.num_key_value_heads = arch == "llama" ? 2 : 4;
  m.intermediate_size = 48;
  m.max_position_embeddings = 128;
  m.tie_word_embeddings = arch == "gpt2";
  m.norm_eps = arch == "gpt2" ? 1e-5 : 1e-6;
  return m;
}

}  // namespace

TEST_CASE("text form of the model graphs matches the golden files", "[printer]") {
  check_golden("gpt2-1layer.txt", to_text(*build_forward(tiny("gpt2"), DType::f32)));
  check_golden("llama-1layer-gqa.txt", to_text(*build_forward(tiny("llama"), DType::f32)));
}

TEST_CASE("text form shows symbolic slices and assumptions", "[printer]") {
  Graph g;
  Builder b(g);
  const Dim S = Dim::sym("S"), B = Dim::sym("B");
  Node* ids = b.input("ids", DType::i64, {B, S}, Role::input_ids);
  g.assume({S, 4});
  Node* r = b.slice(ids, 1, S / 4, Dim(2) * (S / 4), "ids.r");
  g.add_output(r);
  CHECK(to_text(g) ==
        "assume S % 4 == 0\n"
        "%ids = input()                                         i64[B, S]  role=input_ids\n"
        "%ids.r = slice(%ids, dim=1, end=2*(S//4), start=S//4)  i64[B, S//4]\n"
        "outputs: %ids.r\n");
}

TEST_CASE("json form follows the contract", "[printer]") {
  auto g = build_forward(tiny("llama"), DType::f32);
  auto j = to_json(*g);
  REQUIRE(j["nodes"].is_array());
  REQUIRE(j["nodes"].size() == g->size());
  for (size_t i = 0; i < j["nodes"].size(); ++i) {
    const auto& n = j["nodes"][i];
    for (const char* key : {"id", "name", "op", "inputs", "dtype", "shape", "role", "attrs"}) CHECK(n.contains(key));
    CHECK(n["id"] == static_cast<int>(i));
    for (const auto& in : n["inputs"]) CHECK(in.get<int>() < static_cast<int>(i));  // execution order
    for (const auto& d : n["shape"]) CHECK(d.is_string());
  }
  const auto& first = j["nodes"][0];
  CHECK(first["name"] == "input_ids");
  CHECK(first["op"] == "input");
  CHECK(first["dtype"] == "i64");
  CHECK(first["shape"] == nlohmann::json::array({"B", "S"}));
  CHECK(first["role"] == "input_ids");
  bool saw_sdpa = false;
  for (const auto& n : j["nodes"])
    if (n["op"] == "sdpa") {
      saw_sdpa = true;
      CHECK(n["attrs"]["causal"] == true);
      CHECK(n["shape"] == nlohmann::json::array({"B", "4", "S", "8"}));
    }
  CHECK(saw_sdpa);
}

TEST_CASE("dot form has one node per graph node and one edge per input", "[printer]") {
  auto g = build_forward(tiny("gpt2"), DType::f32);
  std::string dot = to_dot(*g);
  size_t edges = 0, boxes = 0, inputs = 0;
  for (size_t p = dot.find("->"); p != std::string::npos; p = dot.find("->", p + 1)) ++edges;
  for (size_t p = dot.find("[label="); p != std::string::npos; p = dot.find("[label=", p + 1)) ++boxes;
  for (const auto& n : g->nodes()) inputs += n->inputs().size();
  CHECK(dot.rfind("digraph", 0) == 0);
  CHECK(boxes == g->size());
  CHECK(edges == inputs);
}
