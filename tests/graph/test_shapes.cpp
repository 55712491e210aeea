// Shape rules of the op table, with symbolic dims, and the errors they give.
#include <algorithm>
#include <set>

#include <catch2/catch.hpp>

#include "graph/builder.h"
#include "graph/verify.h"
#include "tensor/check.h"

using namespace autosp;

namespace {
const Dim B = Dim::sym("B"), S = Dim::sym("S");

struct Fixture {
  Graph g;
  Builder b{g};
  Node* x(SymShape s, DType t = DType::f32) { return b.input("x", t, std::move(s), Role::none); }
};
}  // namespace

TEST_CASE("every op has a complete row with a unique name", "[ops]") {
  std::set<std::string_view> names;
  for (size_t i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    CHECK(op_info(op).op == op);
    CHECK(op_info(op).infer != nullptr);
    CHECK(names.insert(op_name(op)).second);  // printed and parsed (json) by name
  }
}

TEST_CASE("the collective ops are exactly those that name a process group", "[ops]") {
  // The executor hands a node the communicator its "group" attribute names; the `collective`
  // column (DCE keeps the node, the memory planner orders background collectives by it) must say
  // the same of every op.
  std::vector<std::string_view> collectives;
  for (size_t i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    const auto& attrs = op_required_attrs(op);
    const bool names_group = std::find(attrs.begin(), attrs.end(), "group") != attrs.end();
    INFO(op_name(op));
    CHECK(op_info(op).collective == names_group);
    if (op_info(op).collective) collectives.push_back(op_name(op));
  }
  CHECK(collectives == std::vector<std::string_view>{"all_to_all", "all_reduce", "all_gather", "reduce_scatter",
                                                     "ring_attention", "ring_attention_backward", "moe_experts_ep",
                                                     "moe_experts_ep_backward"});
}

TEST_CASE("matmul shape rules", "[ops]") {
  Fixture f;
  Node* a = f.x({B, S, 256});
  CHECK(f.b.matmul(a, f.x({256, 64}), false, false)->type().str() == "f32[B, S, 64]");
  CHECK(f.b.matmul(a, f.x({64, 256}), false, true)->type().str() == "f32[B, S, 64]");
  CHECK(f.b.matmul(f.x({B, 8, S, 16}), f.x({B, 8, S, 16}), false, true)->type().str() == "f32[B, 8, S, S]");
  CHECK(f.b.matmul(f.x({B, 256, S}), f.x({256, 64}), true, false)->type().str() == "f32[B, S, 64]");
  CHECK_THROWS_WITH(f.b.matmul(a, f.x({512, 128}), false, false),
                    Catch::Contains("[matmul]") && Catch::Contains("inner dims differ") && Catch::Contains("f32[B, S, 256]"));
  CHECK_THROWS_WITH(f.b.matmul(a, f.x({256, 64}, DType::f64), false, false), Catch::Contains("dtypes differ"));
  CHECK_THROWS_AS(f.b.matmul(f.x({B, S, 8}), f.x({2, S, 8}), false, true), UsageError);
}

TEST_CASE("swiglu_mlp shape rules", "[ops][mlp]") {
  Fixture f;
  Node* x = f.x({B, S, 8});
  Node* wg = f.x({24, 8});
  Node* wu = f.x({24, 8});
  Node* wd = f.x({8, 24});
  Node* y = f.b.swiglu_mlp(x, wg, wu, wd);
  CHECK(y->type().str() == "f32[B, S, 8]");
  Node* dx = f.b.swiglu_mlp_backward(y, x, wg, wu, wd);
  CHECK(dx->type().str() == "f32[B, S, 8]");
  const auto extras = extra_types(*dx);
  REQUIRE(extras.size() == 3);
  CHECK(extras[0].str() == "f32[24, 8]");
  CHECK(extras[1].str() == "f32[24, 8]");
  CHECK(extras[2].str() == "f32[8, 24]");
  CHECK_THROWS_WITH(f.b.swiglu_mlp(x, wg, wu, f.x({24, 8})),
                    Catch::Contains("[swiglu_mlp]") && Catch::Contains("w_down f32[24, 8]") &&
                        Catch::Contains("expected x [..., C], w_gate and w_up [I, C], w_down [C, I]"));
  CHECK_THROWS_WITH(f.b.swiglu_mlp(x, wg, f.x({16, 8}), wd), Catch::Contains("w_up f32[16, 8]"));
  CHECK_THROWS_WITH(f.b.swiglu_mlp(f.x({B, S, 6}), wg, wu, wd), Catch::Contains("x f32[B, S, 6]"));
  CHECK_THROWS_WITH(f.b.swiglu_mlp(x, f.x({24, 8}, DType::f64), wu, wd), Catch::Contains("dtypes differ"));
  CHECK_THROWS_WITH(f.b.swiglu_mlp(x, f.x({24}), wu, wd), Catch::Contains("expected rank 2"));
  CHECK_THROWS_WITH(f.b.swiglu_mlp_backward(f.x({B, S, 4}), x, wg, wu, wd), Catch::Contains("does not match"));
}

// output(node, i) of moe_experts_backward is typed from its input i + 1 alone (not the whole list
// of 1 + 3E extras per output node: quadratic in the experts), the same as extra_types says.
TEST_CASE("moe_experts_backward's outputs are its extra types, and none past the last", "[ops][moe]") {
  Fixture f;
  Node* x = f.x({B, S, 8});
  Node* probs = f.x({B, S, 2});
  std::vector<Node*> gate, up, down;
  for (int e = 0; e < 2; ++e) {
    gate.push_back(f.x({6, 8}));
    up.push_back(f.x({6, 8}));
    down.push_back(f.x({8, 6}));
  }
  Node* y = f.b.moe_experts(x, probs, gate, up, down, 1, false);
  Node* dx = f.b.moe_experts_backward(f.x({B, S, 8}), y->inputs(), 1, false);
  const auto extras = extra_types(*dx);
  REQUIRE(extras.size() == 7);  // dprobs, then 2 gates, 2 ups, 2 downs
  for (int64_t i = 1; i <= 7; ++i) CHECK(f.b.output(dx, i)->type() == extras[static_cast<size_t>(i - 1)]);
  CHECK(f.b.output(dx, 1)->type().str() == "f32[B, S, 2]");
  CHECK(f.b.output(dx, 7)->type().str() == "f32[8, 6]");
  CHECK_THROWS_WITH(f.b.output(dx, 8), Catch::Contains("has no output 8"));
  CHECK_THROWS_WITH(f.b.output(dx, 0), Catch::Contains("has no output 0"));
  CHECK_THROWS_WITH(f.b.output(y, 1), Catch::Contains("has no output 1"));
}

TEST_CASE("broadcasting follows numpy rules on symbolic dims", "[ops]") {
  Fixture f;
  CHECK(f.b.add(f.x({B, S, 64}), f.x({64}))->type().str() == "f32[B, S, 64]");
  CHECK(f.b.mul(f.x({B, 1, 64}), f.x({S, 1}))->type().str() == "f32[B, S, 64]");
  CHECK(f.b.div(f.x({}), f.x({}))->type().str() == "f32[]");
  CHECK_THROWS_WITH(f.b.add(f.x({B, S, 64}), f.x({32})), Catch::Contains("do not broadcast"));
  CHECK_THROWS_AS(f.b.add(f.x({S}), f.x({B})), UsageError);  // different symbols never broadcast
}

TEST_CASE("layout ops keep symbolic shapes", "[ops]") {
  Fixture f;
  Node* x = f.x({B, S, 128});
  Node* r = f.b.reshape(x, {B, S, 8, 16});
  CHECK(r->type().str() == "f32[B, S, 8, 16]");
  CHECK(f.b.transpose(r, 1, 2)->type().str() == "f32[B, 8, S, 16]");
  CHECK(f.b.permute(r, {2, 0, 3, 1})->type().str() == "f32[8, B, 16, S]");
  CHECK(f.b.reshape(x, {B * S, 128})->type().str() == "f32[B*S, 128]");
  CHECK(f.b.slice(x, 1, S / 4, Dim(2) * (S / 4))->type().str() == "f32[B, S//4, 128]");
  CHECK(f.b.slice(x, 2, 32, 96)->type().str() == "f32[B, S, 64]");
  auto parts = f.b.split(x, 2, {64, 32, 32});
  REQUIRE(parts.size() == 3);
  CHECK(parts[2]->type().str() == "f32[B, S, 32]");
  CHECK(f.b.concat({x, f.x({B, S, 64})}, 2)->type().str() == "f32[B, S, 192]");
  CHECK(f.b.concat({x, x}, 1)->type().str() == "f32[B, 2*S, 128]");
  CHECK_THROWS_WITH(f.b.reshape(x, {B, S, 8, 8}), Catch::Contains("element counts differ"));
  CHECK_THROWS_WITH(f.b.reshape(x, {B, -1, 128}), Catch::Contains("-1"));
  CHECK_THROWS_AS(f.b.transpose(x, 0, 3), UsageError);
  CHECK_THROWS_AS(f.b.permute(x, {0, 0, 1}), UsageError);
  CHECK_THROWS_AS(f.b.slice(x, 2, 10, 200), UsageError);
  CHECK_THROWS_AS(f.b.concat({x, f.x({B, S})}, 1), UsageError);
}

TEST_CASE("reshape uses the graph's assumptions", "[ops]") {
  Fixture f;
  Node* x = f.x({B, S / 4, 4, 16});
  CHECK_THROWS_AS(f.b.reshape(x, {B, S, 16}), UsageError);
  f.g.assume({S, 4});
  CHECK(f.b.reshape(x, {B, S, 16})->type().str() == "f32[B, S, 16]");
}

TEST_CASE("model ops check their operands", "[ops]") {
  Fixture f;
  Node* ids = f.x({B, S}, DType::i64);
  Node* w = f.x({100, 64});
  CHECK(f.b.embedding(w, ids)->type().str() == "f32[B, S, 64]");
  CHECK_THROWS_AS(f.b.embedding(w, w), UsageError);
  Node* h = f.x({B, S, 64});
  CHECK(f.b.layernorm(h, f.x({64}), f.x({64}), 1e-5)->type() == h->type());
  CHECK_THROWS_WITH(f.b.rmsnorm(h, f.x({32}), 1e-5), Catch::Contains("does not match"));
  Node* q = f.x({B, 8, S, 16});
  Node* kv = f.x({B, 2, S, 16});
  CHECK(f.b.sdpa(q, kv, kv, true, 0.25)->type().str() == "f32[B, 8, S, 16]");
  CHECK_THROWS_AS(f.b.sdpa(q, f.x({B, 3, S, 16}), f.x({B, 3, S, 16}), true, 0.25), UsageError);
  CHECK_THROWS_AS(f.b.sdpa(q, f.x({B, 2, S / 2, 16}), f.x({B, 2, S / 2, 16}), true, 0.25), UsageError);
  CHECK(f.b.rope(q, ids, 1e4)->type() == q->type());
  CHECK_THROWS_AS(f.b.rope(f.x({B, 8, S, 15}), ids, 1e4), UsageError);
  Node* logits = f.x({B, S, 100});
  CHECK(f.b.cross_entropy_sum(logits, ids)->type().str() == "f32[]");
  CHECK_THROWS_AS(f.b.cross_entropy_sum(logits, f.x({B, 2 * S}, DType::i64)), UsageError);
  CHECK(f.b.count_valid(ids, DType::f64)->type().str() == "f64[]");
}
