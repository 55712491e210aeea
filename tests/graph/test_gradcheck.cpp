// Float64 finite-difference gradient checks of every differentiable op, driven by the op-case
// table: loss = <op(inputs), R> for a fixed random R, autograd's gradient of each float input
// against central differences of the forward.
#include <catch2/catch.hpp>

#include <set>

#include "common/op_cases.h"
#include "graph/autograd.h"
#include "graph/verify.h"
#include "engine/executor.h"

using namespace autosp;
using namespace autosp::testing;

namespace {

struct Check {
  Graph g;
  TensorMap feeds;
  std::vector<std::string> float_inputs;
  std::vector<Node*> grads;
  std::string loss;
  bool rounds = false;  // a value is narrower than f64 (a cast): finite differences do not apply
};

// loss = reshape(out, [1, n]) · reshape(R, [n, 1]), all differentiable ops.
std::unique_ptr<Check> build(const OpCase& c, uint32_t seed) {
  auto k = std::make_unique<Check>();
  Builder b(k->g);
  std::vector<Node*> ins, wrt;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& spec = c.inputs[i];
    const std::string name = "in" + std::to_string(i);
    Node* x = b.input(name, spec.ids ? DType::i64 : DType::f64, spec.shape, Role::none);
    ins.push_back(x);
    naive::Shape shape;
    for (const auto& d : spec.shape) shape.push_back(d.eval(op_case_bindings()));
    const int64_t n = naive::numel(shape);
    if (spec.ids) {
      Vec v = naive::random_uniform(n, seed + i, static_cast<double>(spec.lo), static_cast<double>(spec.hi));
      std::vector<int64_t> ids;
      for (size_t j = 0; j < v.size(); ++j) ids.push_back(spec.ignore && j % 3 == 0 ? -100 : static_cast<int64_t>(std::floor(v[j])));
      k->feeds[name] = Tensor::from_vector(shape, ids);
    } else {
      k->feeds[name] = Tensor::from_vector(shape, naive::random_normal(n, seed + i));
      k->float_inputs.push_back(name);
      wrt.push_back(x);
    }
  }
  Node* out = c.build(b, ins);
  Dim numel(1);
  for (const auto& d : out->shape()) numel = numel * d;
  Node* r = b.input("R", out->dtype(), out->shape(), Role::none);
  naive::Shape rs;
  for (const auto& d : out->shape()) rs.push_back(d.eval(op_case_bindings()));
  k->feeds["R"] = Tensor::from_vector(rs, naive::random_normal(naive::numel(rs), seed + 99)).to(out->dtype());
  Node* dot = b.matmul(b.reshape(out, {1, numel}), b.reshape(r, {numel, 1}), false, false, "dot");
  Node* loss = b.reshape(dot, {}, "loss");
  k->loss = loss->name();
  k->g.add_output(loss);
  k->grads = build_backward(k->g, loss, wrt);
  verify(k->g);
  for (const auto& n : k->g.nodes()) k->rounds |= is_floating(n->dtype()) && n->dtype() != DType::f64;
  return k;
}

double loss_at(const Check& k, const TensorMap& feeds) {
  return Executor(k.g).run(feeds, single_groups()).outputs.at(k.loss).to_doubles()[0];
}

}  // namespace

TEST_CASE("every differentiable op passes a float64 finite-difference check", "[autograd]") {
  for (const auto& c : op_cases()) {
    if (op_info(c.op).vjp == nullptr) continue;
    DYNAMIC_SECTION(c.name) {
      auto k = build(c, 17);
      if (k->rounds && !k->float_inputs.empty()) {
        CHECK(c.op == Op::cast);  // checked exactly by the next test case
        continue;
      }
      RunResult r = Executor(k->g).run(k->feeds, single_groups());
      for (size_t i = 0; i < k->float_inputs.size(); ++i) {
        const std::string& name = k->float_inputs[i];
        const Tensor analytic = r.outputs.at(k->grads[i]->name());
        REQUIRE(analytic.shape() == k->feeds.at(name).shape());
        const auto ga = analytic.to_doubles();
        double scale = 1e-12, err = 0;
        const int64_t n = k->feeds.at(name).numel();
        const int64_t stride = n > 200 ? n / 97 : 1;  // every element of small inputs, a spread sample of large
        for (int64_t j = 0; j < n; j += stride) {
          const double h = 1e-6;
          TensorMap plus = k->feeds, minus = k->feeds;
          plus[name] = k->feeds.at(name).clone();
          minus[name] = k->feeds.at(name).clone();
          plus[name].data<double>()[j] += h;
          minus[name].data<double>()[j] -= h;
          const double numeric = (loss_at(*k, plus) - loss_at(*k, minus)) / (2 * h);
          err = std::max(err, std::abs(numeric - ga[j]));
          scale = std::max(scale, std::abs(numeric));
        }
        INFO(c.name << " input " << name << ": max abs error " << err << ", scale " << scale);
        CHECK(err / scale < 1e-6);
      }
    }
  }
}

// A cast that rounds has no useful finite differences; its gradient is exact instead: the cast is
// linear, so the gradient of <cast(x), R> is R sent back through the casts — the op's own
// reference applied to R (R holds values of the output dtype; cast_from_bf16 rounds it to bf16).
TEST_CASE("the gradient of a rounding cast is the gradient cast back", "[autograd][bf16]") {
  for (const auto& c : op_cases()) {
    if (c.op != Op::cast) continue;
    DYNAMIC_SECTION(c.name) {
      auto k = build(c, 17);
      RunResult r = Executor(k->g).run(k->feeds, single_groups());
      const Tensor& R = k->feeds.at("R");
      const naive::Shape shape(R.shape().begin(), R.shape().end());
      const Tensor& grad = r.outputs.at(k->grads[0]->name());
      CHECK(grad.dtype() == DType::f64);
      CHECK(grad.to_doubles() == c.ref({R.to_doubles()}, {shape}));
    }
  }
}

TEST_CASE("gradients of a value used twice are summed", "[autograd]") {
  // loss = <x ∘ x, 1>  →  dx = 2x
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f64, {3}, Role::none);
  Node* sq = b.mul(x, x, "sq");
  Node* ones = b.full({3, 1}, 1.0, DType::f64, "ones");
  Node* loss = b.reshape(b.matmul(b.reshape(sq, {1, 3}), ones, false, false), {}, "loss");
  g.add_output(loss);
  auto grads = build_backward(g, loss, {x});
  RunResult r = Executor(g).run({{"x", Tensor::from_vector<double>({3}, {1.5, -2.0, 0.25})}});
  CHECK(r.outputs.at(grads[0]->name()).to_doubles() == std::vector<double>{3.0, -4.0, 0.5});
}

TEST_CASE("a parameter the loss does not use gets a zero gradient", "[autograd]") {
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f64, {2}, Role::none);
  Node* unused = b.parameter("unused", DType::f64, {4});
  Node* loss = b.reshape(b.matmul(b.reshape(x, {1, 2}), b.reshape(x, {2, 1}), false, false), {}, "loss");
  g.add_output(loss);
  auto grads = build_backward(g, loss, {unused, x});
  RunResult r = Executor(g).run({{"x", Tensor::from_vector<double>({2}, {1.0, 2.0})},
                                 {"unused", Tensor::zeros({4}, DType::f64)}});
  CHECK(r.outputs.at(grads[0]->name()).to_doubles() == std::vector<double>(4, 0.0));
  CHECK(r.outputs.at(grads[1]->name()).to_doubles() == std::vector<double>{2.0, 4.0});
  CHECK(grads[0]->role() == Role::gradient);
}

TEST_CASE("autograd rejects a non-scalar loss", "[autograd]") {
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f64, {2}, Role::none);
  Node* y = b.neg(x);
  CHECK_THROWS_WITH(build_backward(g, y, {x}), Catch::Contains("not a scalar"));
}

TEST_CASE("the gradient graphs of the op cases reach every backward-only op", "[autograd][ops]") {
  std::set<Op> seen;
  for (const auto& c : op_cases()) {
    auto k = build(c, 3);
    for (const auto& n : k->g.nodes()) seen.insert(n->op());
  }
  for (size_t i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    if (!op_info(op).backward_only) continue;
    INFO("op " << op_name(op));
    CHECK(seen.count(op) == 1);
  }
}
