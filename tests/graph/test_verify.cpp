// The verifier accepts well-formed graphs and rejects each kind of malformed one, naming the node.
#include <catch2/catch.hpp>

#include "graph/builder.h"
#include "graph/verify.h"
#include "tensor/check.h"
#include "models/model.h"

using namespace autosp;

namespace {
const Dim B = Dim::sym("B"), S = Dim::sym("S");

// x [B, S, 16] → reshape → transpose → scale; returns the graph and the nodes.
struct Small {
  Graph g;
  Node *x, *r, *t, *s;
  Small() {
    Builder b(g);
    x = b.input("x", DType::f32, {B, S, 16}, Role::none);
    r = b.reshape(x, {B, S, 4, 4}, "r");
    t = b.transpose(r, 1, 2, "t");
    s = b.scale(t, 0.5, "s");
    g.add_output(s);
  }
};
}  // namespace

TEST_CASE("the verifier accepts the model graphs", "[verify]") {
  ModelConfig gpt2;
  ModelConfig llama;
  llama.arch = Arch::llama;
  llama.num_key_value_heads = 2;
  llama.tie_word_embeddings = false;
  for (const auto& m : {gpt2, llama}) {
    auto g = build_forward(m, DType::f32);
    CHECK_NOTHROW(verify(*g));
    auto c = g->clone();
    CHECK_NOTHROW(verify(*c));
    CHECK(c->size() == g->size());
  }
}

TEST_CASE("the verifier rejects malformed graphs", "[verify]") {
  SECTION("a type that disagrees with the shape rule") {
    Small s;
    s.t->set_type({DType::f32, {B, S, 4, 4}});
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("%t") && Catch::Contains("shape rule gives f32[B, 4, S, 4]"));
  }
  SECTION("a wrong dtype") {
    Small s;
    s.s->set_type({DType::f64, s.s->shape()});
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("%s"));
  }
  SECTION("a missing attribute") {
    Small s;
    s.s->attrs().map().erase("factor");
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("missing attribute 'factor'"));
  }
  SECTION("an attribute of the wrong type") {
    Small s;
    s.t->attrs().set("dim0", std::string("one"));
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("'dim0' is not an integer"));
  }
  SECTION("an attribute out of range") {
    Small s;
    s.t->attrs().set("dim1", int64_t{7});
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("out of range"));
  }
  SECTION("a reshape whose element count changed") {
    Small s;
    s.r->attrs().set("shape", std::vector<Dim>{B, S, 4, 2});
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("%r") && Catch::Contains("element counts differ"));
  }
  SECTION("a parameter without its role") {
    Graph g;
    Builder b(g);
    Node* p = b.parameter("w", DType::f32, {4});
    p->set_role(Role::none);
    CHECK_THROWS_WITH(verify(g), Catch::Contains("parameter without the parameter role"));
  }
  SECTION("a negative dim") {
    Graph g;
    Builder b(g);
    Node* x = b.input("x", DType::f32, {4}, Role::none);
    x->set_type({DType::f32, {Dim(-3)}});
    CHECK_THROWS_WITH(verify(g), Catch::Contains("negative dim"));
  }
  SECTION("a stale type after an edit") {
    Small s;
    s.g.replace_all_uses_with(s.t, s.r, nullptr);  // legal edit: s now scales r [B, S, 4, 4]
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("%s"));  // but s's recorded type is stale
  }
}

TEST_CASE("graph edits keep use lists consistent", "[verify]") {
  Small s;
  Builder b(s.g);
  Node* extra = s.g.insert_after(s.t, Op::neg, {s.t}, {}, "n");
  s.g.replace_all_uses_with(s.t, extra, extra);
  s.s->set_type(infer_type(*s.s, s.g.assumptions()));
  CHECK_NOTHROW(verify(s.g));
  CHECK(s.s->input(0) == extra);
  CHECK(s.t->users().size() == 1);
  CHECK(s.g.position(extra) == s.g.position(s.t) + 1);
  // erase the negation again
  s.g.replace_all_uses_with(extra, s.t);
  s.g.erase(extra);
  CHECK_NOTHROW(verify(s.g));
  CHECK(s.g.find("n") == nullptr);
  CHECK_THROWS(s.g.erase(s.t));  // still used
}
