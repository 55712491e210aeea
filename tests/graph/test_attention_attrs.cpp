// The attention variants as IR attributes (graph/builder.h AttentionAttrs): sdpa carries window and
// softcap only when set (plain attention's IR is unchanged), the verifier rejects a window or
// softcap that is not > 0, naming the node and the attribute, and a Mistral's layers carry its
// sliding_window into sdpa_backward (insert_ring_attention's copy onto ring_attention is exercised
// by the windowed ring tests in tests/comm/test_thread_ring.cpp); and gpt-oss's sinks as sdpa's
// last optional input.
#include <catch2/catch.hpp>

#include <algorithm>

#include "graph/autograd.h"
#include "graph/builder.h"
#include "graph/verify.h"
#include "models/model.h"

using namespace autosp;

namespace {
const Dim B = Dim::sym("B"), S = Dim::sym("S");

// q, k, v [B, 2, S, 8] → sdpa with the attributes `a`, the graph's output.
struct Attn {
  Graph g;
  Node* o;
  explicit Attn(const AttentionAttrs& a) {
    Builder b(g);
    Node* q = b.input("q", DType::f32, {B, 2, S, 8}, Role::none);
    Node* k = b.input("k", DType::f32, {B, 2, S, 8}, Role::none);
    Node* v = b.input("v", DType::f32, {B, 2, S, 8}, Role::none);
    o = b.sdpa(q, k, v, true, 0.5, "attn", nullptr, a);
    g.add_output(o);
  }
};
}  // namespace

TEST_CASE("sdpa carries window and softcap only when set, and the verifier checks them", "[verify][variants]") {
  CHECK_FALSE(Attn({}).o->attrs().has("window"));
  CHECK_FALSE(Attn({}).o->attrs().has("softcap"));
  Attn a({.window = 4, .softcap = 30.0});
  CHECK(attention_attrs(*a.o) == AttentionAttrs{4, 30.0});
  CHECK_NOTHROW(verify(a.g));

  Attn w({.window = 4});
  w.o->attrs().set("window", int64_t(0));
  CHECK_THROWS_WITH(verify(w.g), Catch::Contains("%attn") && Catch::Contains("window 0 must be > 0"));
  w.o->attrs().set("window", int64_t(-3));
  CHECK_THROWS_WITH(verify(w.g), Catch::Contains("window -3 must be > 0"));
  Attn c({.softcap = 1.0});
  c.o->attrs().set("softcap", -50.0);
  CHECK_THROWS_WITH(verify(c.g), Catch::Contains("%attn") && Catch::Contains("softcap -50 must be > 0"));
  c.o->attrs().set("softcap", 0.0);
  CHECK_THROWS_WITH(verify(c.g), Catch::Contains("softcap 0 must be > 0"));
}

TEST_CASE("a Mistral's attention carries its window into the backward", "[verify][variants]") {
  ModelConfig m;
  m.arch = Arch::mistral;
  m.num_hidden_layers = 2;
  m.sliding_window = 16;
  auto g = build_forward(m, DType::f32);
  int forward = 0, backward = 0;
  build_backward(*g, g->find("loss"), g->with_role(Role::parameter));
  for (const auto& n : g->nodes()) {
    if (n->op() == Op::sdpa) forward += attention_attrs(*n) == AttentionAttrs{16, 0.0};
    if (n->op() == Op::sdpa_backward) backward += attention_attrs(*n) == AttentionAttrs{16, 0.0};
  }
  CHECK(forward == 2);
  CHECK(backward == 2);
  CHECK_NOTHROW(verify(*g));
}

// gpt-oss's sinks (decision 174): sdpa's last optional input, [N] of q's dtype, after the document
// starts when there are both; anything else is refused naming the node and the sinks.
TEST_CASE("sdpa takes sinks [N] as its last optional input, and the verifier checks them", "[verify][variants]") {
  auto attn = [](DType sinks_dt, SymShape sinks_shape, bool docs) {
    auto g = std::make_unique<Graph>();
    Builder b(*g);
    Node* q = b.input("q", DType::f32, {B, 2, S, 8}, Role::none);
    Node* k = b.input("k", DType::f32, {B, 1, S, 8}, Role::none);
    Node* v = b.input("v", DType::f32, {B, 1, S, 8}, Role::none);
    Node* d = docs ? b.input("doc_start", DType::i64, {B, S}, Role::doc_start) : nullptr;
    Node* sinks = b.parameter("sinks", sinks_dt, std::move(sinks_shape));
    g->add_output(b.sdpa(q, k, v, true, 0.5, "attn", d, {.window = 3}, sinks));
    return g;
  };
  for (const bool docs : {false, true}) {
    auto g = attn(DType::f32, {2}, docs);
    CHECK_NOTHROW(verify(*g));
    const AttentionInputs in = attention_inputs(*g->find("attn"));
    CHECK(in.sinks == g->find("sinks"));
    CHECK(in.doc_start == (docs ? g->find("doc_start") : nullptr));
  }
  CHECK_THROWS_WITH(verify(*attn(DType::f32, {3}, false)),
                    Catch::Contains("[sdpa] attn") && Catch::Contains("sinks f32[3]") && Catch::Contains("one per query head"));
  CHECK_THROWS_WITH(verify(*attn(DType::f64, {2}, true)), Catch::Contains("sinks f64[2]"));
  CHECK_THROWS_WITH(verify(*attn(DType::f32, {2, 1}, false)), Catch::Contains("sinks f32[2, 1]"));
}

// Their gradient is sdpa_backward's third extra output (dk, dv, dsinks).
TEST_CASE("model.attention_sinks gives every layer its sinks parameter, and their gradient", "[verify][variants]") {
  ModelConfig m;
  m.arch = Arch::mistral;
  m.num_hidden_layers = 2;
  m.attention_sinks = true;
  auto g = build_forward(m, DType::f32);
  std::vector<Node*> sinks;
  for (int l = 0; l < 2; ++l) {
    Node* p = g->find(str("model.layers.", l, ".self_attn.sinks"));
    REQUIRE(p != nullptr);
    CHECK(p->shape() == SymShape{Dim(m.num_attention_heads)});
    CHECK(attention_inputs(*p->users().at(0)).sinks == p);
    sinks.push_back(p);
  }
  const auto grads = build_backward(*g, g->find("loss"), sinks);
  for (Node* d : grads) {
    REQUIRE(d->op() == Op::output);
    CHECK(d->attrs().i("index") == 3);
    CHECK(d->input(0)->op() == Op::sdpa_backward);
    CHECK(std::count(sinks.begin(), sinks.end(), attention_inputs(*d->input(0)).sinks) == 1);
  }
  CHECK_NOTHROW(verify(*g));
  m.attention_sinks = false;
  CHECK(build_forward(m, DType::f32)->find("model.layers.0.self_attn.sinks") == nullptr);
}
