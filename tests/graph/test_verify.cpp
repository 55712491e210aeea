// The verifier accepts well-formed graphs and rejects each kind of malformed one, naming the node.
#include <catch2/catch.hpp>
#include <algorithm>
#include <random>
#include <set>

#include "graph/builder.h"
#include "graph/passes/pass.h"
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
    CHECK_THROWS_WITH(verify(g), Catch::Contains("parameter without the parameter or frozen role"));
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

// After a full verify only the nodes an edit may have changed are inferred again (ir.h:
// type_checked); each kind of edit must still be caught on a graph verified before it.
TEST_CASE("the verifier catches edits made after a full verify", "[verify]") {
  Small s;
  REQUIRE_NOTHROW(verify(s.g));
  REQUIRE(s.g.types_checked_under_assumptions());
  REQUIRE(s.t->type_checked());
  SECTION("a type set by hand") {
    s.t->set_type({DType::f32, {B, S, 4, 4}});
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("%t"));
  }
  SECTION("an input's type, which its user's shape rule reads") {
    s.x->set_type({DType::f32, {B, S, 32}});  // consistent itself (a leaf); r no longer is
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("%r") && Catch::Contains("element counts differ"));
  }
  SECTION("an attribute") {
    s.t->attrs().set("dim1", int64_t{3});
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("%t"));
  }
  SECTION("a replaced input") {
    s.g.replace_all_uses_with(s.t, s.r, nullptr);
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("%s"));
  }
  SECTION("a structure-level verify in between does not count as a type check") {
    s.t->set_type({DType::f32, {B, S, 4, 4}});
    CHECK_NOTHROW(verify(s.g, VerifyLevel::structure));
    CHECK_THROWS_WITH(verify(s.g), Catch::Contains("%t"));
  }
  SECTION("a new assumption makes every type unchecked until the next full verify") {
    s.g.assume(Divisibility{S, 4});
    CHECK_FALSE(s.g.types_checked_under_assumptions());
    CHECK_NOTHROW(verify(s.g));
    CHECK(s.g.types_checked_under_assumptions());
  }
  SECTION("nothing edited: nothing to report, and a clone (every type inferred again) agrees") {
    CHECK_NOTHROW(verify(s.g));
    CHECK_NOTHROW(verify(*s.g.clone()));
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

// The graph's order under edits anywhere (Graph::before/next/prev and the rebuilt positions)
// against a std::vector kept by hand: 2000 random insertions, moves and erasures, many of them
// chained at one place, which is what runs the order labels out of room and relabels them.
TEST_CASE("the graph's order follows edits in the middle", "[verify][ir]") {
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f32, {Dim(4)}, Role::none);
  std::vector<Node*> ref = {x};
  std::mt19937 rng(7);
  for (int step = 0; step < 2000; ++step) {
    const size_t at = rng() % ref.size();
    const int what = static_cast<int>(rng() % 10);
    if (what < 6) {  // insert after ref[at] (a node that reads only x): chains when at is the last insert
      Node* n = g.insert_after(ref[at], Op::scale, {x}, {{"factor", 2.0}}, "n");
      ref.insert(ref.begin() + static_cast<std::ptrdiff_t>(at) + 1, n);
    } else if (what < 8 && at > 0) {  // insert before
      Node* n = g.insert_before(ref[at], Op::scale, {x}, {{"factor", 2.0}}, "m");
      ref.insert(ref.begin() + static_cast<std::ptrdiff_t>(at), n);
    } else if (what == 8 && at > 0 && ref[at]->users().empty()) {
      g.erase(ref[at]);
      ref.erase(ref.begin() + static_cast<std::ptrdiff_t>(at));
    } else if (at > 1 && ref[at]->users().empty()) {  // move to just after x
      g.move_before(ref[at], ref[1]);
      Node* n = ref[at];
      ref.erase(ref.begin() + static_cast<std::ptrdiff_t>(at));
      ref.insert(ref.begin() + 1, n);
    }
    if (step % 97 == 0 || step == 1999) {
      REQUIRE(g.size() == ref.size());
      for (size_t i = 0; i + 1 < ref.size(); ++i) {
        REQUIRE(g.before(ref[i], ref[i + 1]));
        REQUIRE_FALSE(g.before(ref[i + 1], ref[i]));
        REQUIRE(g.next(ref[i]) == ref[i + 1]);
        REQUIRE(g.prev(ref[i + 1]) == ref[i]);
      }
      for (size_t i = 0; i < ref.size(); ++i) {
        REQUIRE(g.nodes()[i].get() == ref[i]);
        REQUIRE(g.position(ref[i]) == i);
      }
      verify(g, VerifyLevel::full);
    }
  }
  // Names made unique as the original did: the first free "<base>.<i>", reused after an erase.
  Node* a = g.add(Op::scale, {x}, {{"factor", 1.0}}, "n");
  const std::string name = a->name();
  g.erase(a);
  CHECK(g.add(Op::scale, {x}, {{"factor", 1.0}}, "n")->name() == name);
}

// The graph's outputs under replace_all_uses_with (each output's slot kept in its node, ir.h)
// against a std::vector kept by hand with the scan the Graph used to do: 400 random replacements
// of outputs and non-outputs, onto new nodes and onto nodes that are outputs already.
TEST_CASE("the graph's outputs follow replace_all_uses_with", "[verify][ir]") {
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f32, {Dim(4)}, Role::none);
  std::vector<Node*> nodes, ref;
  std::mt19937 rng(11);
  for (int i = 0; i < 40; ++i) {
    nodes.push_back(g.add(Op::scale, {x}, {{"factor", 1.0}}, "n"));
    if (rng() % 2) {
      g.add_output(nodes.back());
      ref.push_back(nodes.back());
    }
  }
  for (int step = 0; step < 400; ++step) {
    Node* from = nodes[rng() % nodes.size()];
    Node* to = rng() % 4 ? g.add(Op::scale, {x}, {{"factor", 1.0}}, "m") : nodes[rng() % nodes.size()];
    if (to == from) continue;
    if (std::find(nodes.begin(), nodes.end(), to) == nodes.end()) nodes.push_back(to);
    g.replace_all_uses_with(from, to);
    for (Node*& o : ref)
      if (o == from) o = to;
    REQUIRE(g.outputs() == ref);
    for (Node* n : nodes) REQUIRE(g.is_output(n) == (std::find(ref.begin(), ref.end(), n) != ref.end()));
  }
}

namespace {
PassResult no_edit(Graph&, const PassContext&) { return {}; }
PassResult wrong_type(Graph& g, const PassContext&) {  // breaks the graph: t's type disagrees with its rule
  g.find("t")->set_type({DType::f32, {B, S, 4, 4}});
  return {true};
}
}  // namespace

// A pipeline verified once (a rank's program in Release builds) finds what the verifier after each
// pass finds, and run_pipeline_verified_once still names the pass that broke the graph.
TEST_CASE("a pipeline verified once names the pass that broke the graph", "[verify]") {
  const std::vector<Pass> good = {{"a", no_edit, true}, {"b", no_edit, true}};
  const std::vector<Pass> bad = {{"a", no_edit, true}, {"breaks", wrong_type, true}, {"c", no_edit, true}};
  auto make = [] {
    Small s;
    return std::make_unique<Graph>(std::move(s.g));
  };
  std::vector<PassTime> times;
  auto g = run_pipeline_verified_once(make, good, {}, &times);
  REQUIRE(g);
  CHECK(g->find("s"));
  REQUIRE(times.size() == 3);
  CHECK(times.back().name == "verify");
  CHECK_THROWS_WITH(run_pipeline(*make(), bad, {}, nullptr, VerifyWhen::once),
                    Catch::Contains("%t") && Catch::Contains("(after the passes [a, breaks, c])"));
  CHECK_THROWS_WITH(run_pipeline(*make(), bad, {}, nullptr, VerifyWhen::each_pass),
                    Catch::Contains("%t") && Catch::Contains("in pass breaks after [a]"));
  CHECK_THROWS_WITH(run_pipeline_verified_once(make, bad, {}),
                    Catch::Contains("%t") && Catch::Contains("in pass breaks after [a]"));
}

// with_role (the order vector when it is current, else the list) against a filter of nodes() by
// hand, with the order current and right after edits in the middle.
TEST_CASE("with_role finds the nodes of a role in order", "[verify][ir]") {
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f32, {Dim(4)}, Role::none);
  std::mt19937 rng(5);
  auto by_hand = [&](Role r) {
    std::vector<Node*> out;
    for (const auto& n : g.nodes())
      if (n->role() == r) out.push_back(n.get());
    return out;
  };
  std::vector<Node*> nodes = {x};
  for (int step = 0; step < 300; ++step) {
    const Role role = rng() % 3 ? Role::none : Role::gradient;
    Node* at = nodes[rng() % nodes.size()];
    nodes.push_back(rng() % 2 ? g.add(Op::scale, {x}, {{"factor", 1.0}}, "n", role)
                              : g.insert_after(at, Op::scale, {x}, {{"factor", 1.0}}, "m", role));
    if (step % 7 == 0) nodes.back()->set_role(Role::loss);
    const std::vector<Node*> unordered = g.with_role(Role::gradient);  // before nodes() rebuilds the order
    REQUIRE(unordered == by_hand(Role::gradient));
    REQUIRE(g.with_role(Role::gradient) == by_hand(Role::gradient));  // from the order vector
    REQUIRE(g.with_role(Role::loss) == by_hand(Role::loss));
  }
}

// Names against a naive uniquing (a set of the live names, scanned from "<base>.1" each time):
// 3000 random adds, inserts, erasures and failed adds (a shape rule that throws), with bases that
// are each other's suffixed names ("a", "a.1", "a.1.1") and explicit names ahead of the counter
// ("a.7"), so the index's keys (views of the nodes' own names) and the per-base counter are both
// exercised. Every node is found under its name; an erased or failed name is found no more.
TEST_CASE("names are the first free <base>.<i>, as a naive scan finds", "[verify][ir]") {
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f32, {Dim(4)}, Role::none);
  std::set<std::string> live = {"x"};
  std::vector<Node*> nodes;
  auto naive = [&](std::string base) {
    if (base.empty()) base = "v";
    if (!live.count(base)) return base;
    for (int i = 1;; ++i)
      if (!live.count(base + "." + std::to_string(i))) return base + "." + std::to_string(i);
  };
  const std::vector<std::string> bases = {"a", "a.1", "a.1.1", "a.7", "a.10", "b", "", "v", "v.2",
                                          "l0.mlp.experts.3.gate_proj.weight.gather"};
  std::mt19937 rng(13);
  for (int step = 0; step < 3000; ++step) {
    const std::string base = bases[rng() % bases.size()];
    const int what = static_cast<int>(rng() % 10);
    if (what < 5 || nodes.empty()) {
      const std::string want = naive(base);
      Node* n = rng() % 2 || nodes.empty() ? g.add(Op::scale, {x}, {{"factor", 1.0}}, base)
                                           : g.insert_after(nodes[rng() % nodes.size()], Op::scale, {x},
                                                            {{"factor", 1.0}}, base);
      REQUIRE(n->name() == want);
      live.insert(want);
      nodes.push_back(n);
    } else if (what < 9) {
      const size_t at = rng() % nodes.size();
      const std::string name = nodes[at]->name();
      g.erase(nodes[at]);
      nodes.erase(nodes.begin() + static_cast<std::ptrdiff_t>(at));
      live.erase(name);
      REQUIRE(g.find(name) == nullptr);
    } else {  // a node its shape rule rejects takes no name
      const std::string want = naive(base);
      REQUIRE_THROWS(g.add(Op::matmul, {x, x}, {}, base));
      REQUIRE(g.find(want) == nullptr);
    }
    if (step % 101 == 0 || step == 2999) {
      REQUIRE(g.size() == live.size());
      REQUIRE(g.name_index_size() == live.size());
      for (Node* n : nodes) REQUIRE(g.find(n->name()) == n);
      verify(g, VerifyLevel::full);
    }
  }
}
