// passes/concat_slice_grads: the gradient of a tensor split into slices becomes one concat where
// the slices tile the dim (GPT-2's qkv), and stays slice_backward + add where they do not (a gap,
// an overlap, an inner sum read elsewhere). Gradients with the pass against those without it are
// equal to the bit (concat only moves values; each element of the sum was one value plus zeros),
// checked on hand-built graphs and the tiny GPT-2 program; the whole model against its unfused
// form is in test_fuse_elementwise ("fused and unfused models give the same loss and gradients").
#include <catch2/catch.hpp>

#include "common/naive.h"
#include "common/tiny_models.h"
#include "compiler/program.h"
#include "engine/executor.h"
#include "graph/autograd.h"
#include "graph/builder.h"
#include "graph/passes/concat_slice_grads.h"
#include "graph/verify.h"
#include "tensor/tensor.h"

using namespace autosp;

namespace {

size_t count(const Graph& g, Op op) {
  size_t n = 0;
  for (const auto& node : g.nodes()) n += node->op() == op;
  return n;
}

using Pieces = std::vector<std::pair<int64_t, int64_t>>;

struct Split {
  Graph g;
  std::vector<Node*> grads;
};

// x [3, 7] cut along dim 1 into `pieces` ([start, end) each); loss = Σ over the
// pieces of <piece², R_i>, so each piece's gradient 2·piece·R_i differs.
std::unique_ptr<Split> build(const Pieces& pieces) {
  auto s = std::make_unique<Split>();
  Builder b(s->g);
  Node* x = b.input("x", DType::f64, {3, 7}, Role::none);
  Node* total = nullptr;
  for (size_t i = 0; i < pieces.size(); ++i) {
    Node* p = b.slice(x, 1, pieces[i].first, pieces[i].second, "p" + std::to_string(i));
    Node* r = b.input("r" + std::to_string(i), DType::f64, p->shape(), Role::none);
    Node* term = b.mul(b.mul(p, p), r);
    const int64_t n = 3 * (pieces[i].second - pieces[i].first);
    Node* flat = b.reshape(term, {1, n});
    Node* ones = b.input("o" + std::to_string(i), DType::f64, {n, 1}, Role::none);
    Node* dot = b.reshape(b.matmul(flat, ones, false, false), {});
    total = total ? b.add(total, dot) : dot;
  }
  s->g.add_output(total);
  s->grads = build_backward(s->g, total, {x});
  return s;
}

TensorMap feeds(const Pieces& pieces) {
  TensorMap f;
  f["x"] = Tensor::from_vector({3, 7}, naive::random_normal(21, 1));
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int64_t w = pieces[i].second - pieces[i].first;
    f["r" + std::to_string(i)] = Tensor::from_vector({3, w}, naive::random_normal(3 * w, 10 + uint32_t(i)));
    f["o" + std::to_string(i)] = Tensor::from_vector({3 * w, 1}, std::vector<double>(size_t(3 * w), 1.0));
  }
  return f;
}

}  // namespace

TEST_CASE("concat_slice_grads turns the gradient of slices that tile a dim into one concat, exactly",
          "[concat_slice_grads]") {
  struct Case {
    Pieces pieces;
    size_t slice_backwards_left;  // after the pass
  };
  for (const Case& c : std::vector<Case>{{{{0, 2}, {2, 5}, {5, 7}}, 0},
                                         {{{0, 3}, {3, 7}}, 0},
                                         {{{0, 1}, {1, 2}, {2, 3}, {3, 7}}, 0},
                                         // [0, 3) twice: the inner pair ([3, 7) and one [0, 3)) tiles
                                         // the dim and becomes the concat; the other [0, 3) is added
                                         {{{0, 3}, {0, 3}, {3, 7}}, 1}}) {
    const Pieces& pieces = c.pieces;
    INFO("pieces " << pieces.size() << ", the first ends at " << pieces[0].second);
    auto plain = build(pieces), fused = build(pieces);
    REQUIRE(count(fused->g, Op::slice_backward) == pieces.size());
    REQUIRE(fused->g.outputs().back() == fused->grads[0]);
    REQUIRE(passes::concat_slice_grads(fused->g, PassContext{}).changed);
    verify(fused->g);
    CHECK(count(fused->g, Op::slice_backward) == c.slice_backwards_left);
    CHECK(count(fused->g, Op::concat) == 1);
    const TensorMap f = feeds(pieces);
    const auto want = Executor(plain->g).run(f).outputs.at(plain->grads[0]->name()).to_doubles();
    // The gradient is the graph's last output (the pass moved it from the add to the concat).
    const auto got = Executor(fused->g).run(f).outputs.at(fused->g.outputs().back()->name()).to_doubles();
    CHECK(got == want);
    if (c.slice_backwards_left > 0) continue;
    // And it is the right one: 2·x·r on each piece.
    const auto x = f.at("x").to_doubles();
    for (size_t i = 0; i < pieces.size(); ++i) {
      const auto r = f.at("r" + std::to_string(i)).to_doubles();
      const int64_t w = pieces[i].second - pieces[i].first;
      for (int64_t row = 0; row < 3; ++row)
        for (int64_t k = 0; k < w; ++k)
          CHECK(got[size_t(row * 7 + pieces[i].first + k)] ==
                Approx(2 * x[size_t(row * 7 + pieces[i].first + k)] * r[size_t(row * w + k)]).epsilon(1e-14));
    }
  }
}

TEST_CASE("concat_slice_grads leaves slices that do not tile the dim", "[concat_slice_grads]") {
  for (const Pieces& pieces : std::vector<Pieces>{{{0, 2}, {3, 7}},    // a gap
                                                  {{0, 4}, {2, 7}},    // an overlap
                                                  {{1, 3}, {3, 7}},    // not from 0
                                                  {{0, 2}, {2, 5}}}) { // not to the end
    INFO("first piece [" << pieces[0].first << ", " << pieces[0].second << ")");
    auto s = build(pieces);
    const size_t before = count(s->g, Op::slice_backward);
    CHECK_FALSE(passes::concat_slice_grads(s->g, PassContext{}).changed);
    CHECK(count(s->g, Op::slice_backward) == before);
    CHECK(count(s->g, Op::concat) == 0);
  }
}

TEST_CASE("concat_slice_grads leaves a chain whose inner sum has another user", "[concat_slice_grads]") {
  auto s = build({{0, 2}, {2, 5}, {5, 7}});
  // Read the inner add (the sum of two slice gradients) once more, as a graph output.
  Node* inner = nullptr;
  for (const auto& n : s->g.nodes())
    if (n->op() == Op::add && n->input(0)->op() == Op::slice_backward && n->input(1)->op() == Op::slice_backward)
      inner = n.get();
  REQUIRE(inner != nullptr);
  s->g.add_output(inner);
  CHECK_FALSE(passes::concat_slice_grads(s->g, PassContext{}).changed);
  CHECK(count(s->g, Op::slice_backward) == 3);
}

// Where qkv_heads does not take the split (here: under activation checkpointing; also CUDA
// programs), the qkv gradient is one concat per layer; the CPU's default program has one
// qkv_heads_backward per layer instead, and no slice gradients at all.
TEST_CASE("the GPT-2 program's qkv gradient is one concat per layer", "[concat_slice_grads]") {
  for (const bool fuse : {true, false}) {
    for (const bool checkpointing : {true, false}) {
      const Config cfg = parse_config({{"model", testing::tiny_model("gpt2", 32, 2, 48)},
                                       {"data", {{"seq_len", 16}, {"batch_size", 2}}},
                                       {"runtime", {{"fuse_kernels", fuse}, {"activation_checkpointing", checkpointing}}}});
      RankProgram prog = build_program(cfg, DType::f32, Stage::joint);
      INFO("fuse " << fuse << ", checkpointing " << checkpointing);
      const bool heads = fuse && !checkpointing;
      CHECK(count(*prog.graph, Op::slice_backward) == (fuse ? 0u : 6u));
      CHECK(count(*prog.graph, Op::concat) == (fuse && !heads ? 2u : 0u));
      CHECK(count(*prog.graph, Op::qkv_heads_backward) == (heads ? 2u : 0u));
    }
  }
}
