// gpt-oss's expert options on moe_experts (graph/builder.h MoeExpertOptions): the builder sets the
// optional attributes only when asked (Mixtral's IR unchanged), the printer shows them, the vjp
// hands them to the backward, whose extra outputs are typed like the biases; and garbage (a bias
// list of the wrong length or shape, an unknown activation, a limit that is not > 0) is a
// UsageError naming the node and what was expected.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "graph/autograd.h"
#include "graph/builder.h"
#include "graph/printer.h"
#include "graph/verify.h"
#include "tensor/check.h"

using namespace autosp;

namespace {
const Dim B = Dim::sym("B"), S = Dim::sym("S");

// x [B, S, 6], probs [B, S, 4], per expert w_gate, w_up [5, 6], w_down [6, 5], b_gate, b_up [5],
// b_down [6].
struct Experts {
  Graph g;
  Builder b{g};
  Node *x, *probs;
  std::vector<Node*> w[6];
  Experts() {
    x = b.input("x", DType::f32, {B, S, 6}, Role::none);
    probs = b.input("probs", DType::f32, {B, S, 4}, Role::none);
    for (int which = 0; which < 6; ++which)
      for (int e = 0; e < 4; ++e) {
        const SymShape s = which < 2 ? SymShape{5, 6} : which == 2 ? SymShape{6, 5} : which < 5 ? SymShape{5} : SymShape{6};
        w[which].push_back(b.parameter("experts." + std::to_string(e) + ".p" + std::to_string(which), DType::f32, s));
      }
  }
  MoeExpertOptions gpt_oss() const { return {w[3], w[4], w[5], MoeActivation::clamped_swiglu, 1.702, 7.0}; }
  Node* moe(const MoeExpertOptions& opt) { return b.moe_experts(x, probs, w[0], w[1], w[2], 2, true, "experts", opt); }
};
}  // namespace

TEST_CASE("moe_experts carries gpt-oss's options only when set, and its backward takes them", "[ops][moe]") {
  Experts plain;
  Node* y0 = plain.moe({});
  CHECK(y0->attrs().map().size() == 2);  // top_k, norm_topk_prob: Mixtral's IR as before
  CHECK_FALSE(moe_biased(*y0));
  CHECK_FALSE(moe_clamped(*y0));

  Experts f;
  Node* y = f.moe(f.gpt_oss());
  CHECK(y->inputs().size() == 2 + 6 * 4);
  CHECK(moe_biased(*y));
  CHECK(moe_clamped(*y));
  f.g.add_output(y);
  const std::string text = to_text(f.g);
  INFO(text);
  CHECK(text.find("activation=\"clamped_swiglu\"") != std::string::npos);
  CHECK(text.find("limit=7") != std::string::npos);
  CHECK(text.find("biases=true") != std::string::npos);

  Node* loss = f.b.reshape(f.b.matmul(f.b.reshape(y, {1, B * S * 6}), f.b.input("r", DType::f32, {B * S * 6, 1},
                                                                                  Role::none), false, false), {});
  std::vector<Node*> wrt{f.x, f.probs};
  for (const auto& list : f.w) wrt.insert(wrt.end(), list.begin(), list.end());
  const std::vector<Node*> grads = build_backward(f.g, loss, wrt);
  verify(f.g);
  REQUIRE(grads.size() == wrt.size());
  const Node* bwd = grads[0];
  CHECK(bwd->op() == Op::moe_experts_backward);
  CHECK(moe_biased(*bwd));
  CHECK(moe_clamped(*bwd));
  CHECK(bwd->attrs().f("alpha") == 1.702);
  for (size_t i = 0; i < wrt.size(); ++i) CHECK(grads[i]->type() == wrt[i]->type());  // db_down [6] among them
}

TEST_CASE("moe_experts rejects gpt-oss options that do not fit, naming the node", "[ops][moe]") {
  {
    Experts f;
    MoeExpertOptions opt = f.gpt_oss();
    opt.b_down.pop_back();
    CHECK_THROWS_WITH(f.moe(opt), Catch::Contains("[moe_experts] experts") &&
                                      Catch::Contains("4 experts but 4 gate, 4 up and 3 down biases"));
  }
  {
    Experts f;
    MoeExpertOptions opt = f.gpt_oss();
    std::swap(opt.b_up, opt.b_down);  // [6] biases where [5] belong
    CHECK_THROWS_WITH(f.moe(opt), Catch::Contains("[moe_experts] experts") && Catch::Contains("expert 0's b_up f32[6]"));
  }
  {
    Experts f;
    Node* y = f.moe(f.gpt_oss());
    f.g.add_output(y);
    y->attrs().set("activation", std::string("gelu"));
    CHECK_THROWS_WITH(verify(f.g), Catch::Contains("[moe_experts] experts") && Catch::Contains("activation 'gelu'"));
    y->attrs().set("activation", std::string("clamped_swiglu"));
    y->attrs().set("limit", 0.0);
    CHECK_THROWS_WITH(verify(f.g), Catch::Contains("limit 0: expected a finite alpha and limit > 0"));
    y->attrs().set("limit", 7.0);
    y->attrs().set("alpha", std::nan(""));
    CHECK_THROWS_WITH(verify(f.g), Catch::Contains("expected a finite alpha"));
    y->attrs().set("alpha", 1.702);
    y->attrs().set("biases", false);  // 6E parameter inputs but no biases said
    CHECK_THROWS_WITH(verify(f.g), Catch::Contains("expected 12 expert weights"));
  }
}
