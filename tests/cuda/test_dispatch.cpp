// Every op of the op-case table (tests/common/op_cases.h) through the executor and the dispatch
// table on CUDA, forward and backward, against the same graph on the CPU kernels (bf16 on the CPU:
// f32 kernels with one rounding per result, the CUDA kernels' numerics), and the forward against
// the case's naive reference. Then what the table promises beyond the cases: strided device inputs,
// the dtype errors, ids that are out of range, nothing falling back to the CPU, and the executor's
// attention backend reaching the sdpa launcher.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "common/op_cases.h"
#include "cuda/dispatch_test.h"
#include "graph/autograd.h"
#include "graph/verify.h"
#include "kernels/cuda/cudnn_attention.cuh"

using namespace autosp;
using namespace autosp::testing;
using namespace autosp::cudatest;

namespace {

struct Built {
  Graph g;
  TensorMap feeds;
  std::vector<Vec> values;  // the inputs as the kernels see them (for the naive reference)
  std::vector<naive::Shape> shapes;
  Node* out = nullptr;
  bool backward = false;
};

// The case's op on inputs of dtype `dt` (ids int64), and when the op is differentiable and has a
// float input, loss = <out, R> (R random, out's dtype) with the gradient of every float input.
std::unique_ptr<Built> build(const OpCase& c, DType dt, uint32_t seed) {
  auto k = std::make_unique<Built>();
  Builder b(k->g);
  std::vector<Node*> ins, wrt;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& spec = c.inputs[i];
    const std::string name = "in" + std::to_string(i);
    Node* x = b.input(name, spec.ids ? DType::i64 : dt, spec.shape, Role::none);
    ins.push_back(x);
    naive::Shape shape;
    for (const auto& d : spec.shape) shape.push_back(d.eval(op_case_bindings()));
    const int64_t n = naive::numel(shape);
    if (spec.ids) {
      Vec v = naive::random_uniform(n, seed + i, static_cast<double>(spec.lo), static_cast<double>(spec.hi));
      for (auto& e : v) e = std::floor(e);
      if (spec.ignore)
        for (size_t j = 0; j < v.size(); j += 3) v[j] = -100;
      k->feeds[name] = Tensor::from_vector(shape, as_ids(v));
      k->values.push_back(v);
    } else {
      k->feeds[name] = Tensor::from_vector(shape, naive::random_normal(n, seed + i)).to(dt);
      k->values.push_back(k->feeds[name].to_doubles());
      wrt.push_back(x);
    }
    k->shapes.push_back(shape);
  }
  k->out = c.build(b, ins);
  k->g.add_output(k->out);
  k->backward = op_info(c.op).vjp != nullptr && !wrt.empty() && is_floating(k->out->dtype());
  if (k->backward) {
    Dim numel(1);
    naive::Shape rs;
    for (const auto& d : k->out->shape()) {
      numel = numel * d;
      rs.push_back(d.eval(op_case_bindings()));
    }
    Node* r = b.input("R", k->out->dtype(), k->out->shape(), Role::none);
    k->feeds["R"] = Tensor::from_vector(rs, naive::random_normal(naive::numel(rs), seed + 99)).to(k->out->dtype());
    Node* dot = b.matmul(b.reshape(k->out, {1, numel}), b.reshape(r, {numel, 1}), false, false, "dot");
    k->g.add_output(b.reshape(dot, {}, "loss"));
    build_backward(k->g, k->g.outputs().back(), wrt);
  }
  verify(k->g);
  return k;
}

}  // namespace

TEST_CASE("every op case runs on CUDA through dispatch and matches the CPU, forward and backward", "[dispatch]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const auto& c : op_cases()) {
      DYNAMIC_SECTION(c.name << " " << dtype_name(dt)) {
        auto k = build(c, dt, 11);
        // A graph without leaves runs where its (absent) feeds are, on the CPU (engine/executor.cpp
        // feed_device): `full` alone cannot reach CUDA here; the training graphs run it there
        // beside their fed inputs (test_trainer_cuda, test_models).
        if (k->feeds.empty()) continue;
        const RunResult cpu = Executor(k->g).run(k->feeds, single_groups());
        const RunResult gpu = Executor(k->g).run(upload(k->feeds), single_groups());
        REQUIRE(gpu.outputs.size() == cpu.outputs.size());
        for (const Node* o : k->g.outputs()) {
          // A gradient is checked with the tolerance of its dtype; the forward output with its own.
          const DType odt = o->dtype() == DType::bf16 ? DType::bf16 : dt;
          const double tol = odt == DType::bf16 && c.bf16_tolerance > 0 ? c.bf16_tolerance : tolerance_for(odt);
          check_tensor(c.name + " " + std::string(dtype_name(dt)) + " output " + o->name(), gpu.outputs.at(o->name()),
                       cpu.outputs.at(o->name()), tol);
        }
        CHECK(gpu.peak_bytes > 0);
        // The forward against the independent naive reference (in double, on the rounded inputs).
        const Vec want = c.ref(k->values, k->shapes);
        const Vec got = down(gpu.outputs.at(k->out->name())).to_doubles();
        REQUIRE(got.size() == want.size());
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (1 + std::abs(want[i])));
        INFO(c.name << " " << dtype_name(dt) << " vs the naive reference: worst scaled error " << worst);
        CHECK(worst <= (dt == DType::bf16 || k->out->dtype() == DType::bf16 ? 2e-2 : 1e-5));
      }
    }
  }
}

TEST_CASE("every op has a CUDA launcher: none says it has no CUDA kernel", "[dispatch]") {
  std::set<Op> ran;
  for (DType dt : {DType::f32}) {
    for (const auto& c : op_cases()) {
      auto k = build(c, dt, 5);
      for (const auto& n : k->g.nodes()) ran.insert(n->op());
      CHECK_NOTHROW(Executor(k->g).run(upload(k->feeds), single_groups()));
    }
  }
  for (size_t i = 0; i < kNumOps; ++i) {
    if (static_cast<Op>(i) == Op::input || static_cast<Op>(i) == Op::parameter) continue;  // not dispatched
    INFO("op " << op_name(static_cast<Op>(i)) << " is not reached by any op case or its backward");
    CHECK(ran.count(static_cast<Op>(i)) == 1);
  }
}

TEST_CASE("strided device inputs are made contiguous on the device", "[dispatch]") {
  // x is fed as a transposed view of a device tensor: [S, C] viewed from [C, S].
  Graph g;
  Builder b(g);
  const Dim S = Dim::sym("S");
  Node* x = b.input("x", DType::f32, {S, 6}, Role::none);
  Node* w = b.input("w", DType::f32, {6, 3}, Role::none);
  Node* y = b.input("y", DType::f32, {S, 6}, Role::none);
  g.add_output(b.matmul(x, w, false, false, "mm"));
  g.add_output(b.add(x, y, "sum"));
  g.add_output(b.gelu_tanh(x));
  g.add_output(b.transpose(x, 0, 1));
  const Tensor base = Tensor::from_vector({6, 5}, naive::random_normal(30, 3)).to(DType::f32);
  const Tensor xt_host = base.as_strided({5, 6}, {1, 5}, 0);
  const TensorMap host{{"x", xt_host.contiguous()},
                       {"w", Tensor::from_vector({6, 3}, naive::random_normal(18, 4)).to(DType::f32)},
                       {"y", Tensor::from_vector({5, 6}, naive::random_normal(30, 5)).to(DType::f32)}};
  TensorMap dev = upload(host);
  const Tensor base_dev = up(base);
  dev["x"] = base_dev.as_strided({5, 6}, {1, 5}, 0);
  REQUIRE_FALSE(dev["x"].is_contiguous());
  const RunResult cpu = Executor(g).run(host);
  const RunResult gpu = Executor(g).run(dev);
  for (const Node* o : g.outputs()) check_tensor(o->name(), gpu.outputs.at(o->name()), cpu.outputs.at(o->name()), 1e-5);
  // The strided D2H copy itself.
  check_tensor("strided download", up(down(dev["x"])), xt_host.contiguous(), 0);
}

TEST_CASE("a dtype a CUDA kernel lacks is a usage error naming the op and the dtype", "[dispatch]") {
  Graph g;
  Builder b(g);
  Node* q = b.input("q", DType::f64, {1, 2, 4, 8}, Role::none);
  g.add_output(b.sdpa(q, q, q, true, 0.5));
  const TensorMap feeds{{"q", up(Tensor::from_vector({1, 2, 4, 8}, naive::random_normal(64, 1)))}};
  CHECK_THROWS_AS(Executor(g).run(feeds), UsageError);
  CHECK_THROWS_WITH(Executor(g).run(feeds), Catch::Contains("sdpa") && Catch::Contains("f64"));
}

TEST_CASE("an embedding id out of range gives a NaN row on CUDA (no host check per step)", "[dispatch]") {
  Graph g;
  Builder b(g);
  Node* w = b.input("w", DType::f32, {11, 4}, Role::none);
  Node* ids = b.input("ids", DType::i64, {1, 3}, Role::none);
  g.add_output(b.embedding(w, ids));
  const TensorMap feeds{{"w", up(Tensor::from_vector({11, 4}, naive::random_normal(44, 2)).to(DType::f32))},
                        {"ids", up(Tensor::from_vector<int64_t>({1, 3}, {3, 11, 0}))}};
  const auto out = down(Executor(g).run(feeds).outputs.begin()->second).to_doubles();
  REQUIRE(out.size() == 12);
  for (int i = 0; i < 4; ++i) {
    CHECK(std::isfinite(out[i]));
    CHECK(std::isnan(out[4 + i]));
    CHECK(std::isfinite(out[8 + i]));
  }
}

TEST_CASE("i32 ids are widened on the device", "[dispatch]") {
  Graph g;
  Builder b(g);
  Node* w = b.input("w", DType::f32, {11, 4}, Role::none);
  Node* ids = b.input("ids", DType::i32, {2, 3}, Role::none);
  g.add_output(b.embedding(w, ids));
  const TensorMap host{{"w", Tensor::from_vector({11, 4}, naive::random_normal(44, 2)).to(DType::f32)},
                       {"ids", Tensor::from_vector<int32_t>({2, 3}, {3, 10, 0, 7, 7, 1})}};
  const RunResult cpu = Executor(g).run(host);
  const RunResult gpu = Executor(g).run(upload(host));
  check_tensor("embedding of i32 ids", gpu.outputs.begin()->second, cpu.outputs.begin()->second, 0);
}

TEST_CASE("the executor's attention backend reaches the sdpa launcher", "[dispatch]") {
  // f32 attention, which cuDNN's SDPA never takes: with runtime.attention "cudnn" the launcher
  // says why it falls back to our flash attention (with or without cuDNN in the build); with
  // "flash" it says nothing. Both give the CPU's result.
  Graph g;
  Builder b(g);
  Node* q = b.input("q", DType::f32, {1, 2, 16, 64}, Role::none);
  g.add_output(b.sdpa(q, q, q, true, 0.125, "attn_backend_probe"));
  const TensorMap host{{"q", Tensor::from_vector({1, 2, 16, 64}, naive::random_normal(2 * 16 * 64, 8)).to(DType::f32)}};
  const RunResult cpu = Executor(g).run(host);
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  const RunResult flash = Executor(g, ExecOptions{.attention = AttentionBackend::flash}).run(upload(host));
  const std::string after_flash = log.str();
  const RunResult automatic = Executor(g, ExecOptions{.attention = AttentionBackend::automatic}).run(upload(host));
  const std::string after_auto = log.str();
  const RunResult cudnn = Executor(g, ExecOptions{.attention = AttentionBackend::cudnn}).run(upload(host));
  spdlog::default_logger()->sinks().pop_back();
  CHECK(after_auto.find("runtime.attention") == std::string::npos);  // "auto" falls back silently
  CHECK_THAT(log.str(), Catch::Contains("runtime.attention \"cudnn\"") && Catch::Contains("attn_backend_probe") &&
                            Catch::Contains("using our flash attention"));
  check_tensor("sdpa, flash", flash.outputs.begin()->second, cpu.outputs.begin()->second, 1e-5);
  check_tensor("sdpa, cudnn requested", cudnn.outputs.begin()->second, cpu.outputs.begin()->second, 1e-5);
  check_tensor("sdpa, auto", automatic.outputs.begin()->second, down(flash.outputs.begin()->second), 0);
}

TEST_CASE("runtime.attention \"auto\" runs cuDNN where cuDNN takes the sizes", "[dispatch]") {
  // bf16, D = 64, causal: cuDNN's case. "auto" gives exactly what "cudnn" gives (the same fused
  // kernel), and both are within bf16 tolerance of the CPU. Without cuDNN in the build "auto"
  // gives exactly our flash attention instead.
  Graph g;
  Builder b(g);
  Node* q = b.input("q", DType::bf16, {1, 4, 128, 64}, Role::none);
  g.add_output(b.sdpa(q, q, q, true, 0.125, "attn_auto_probe"));
  const TensorMap host{
      {"q", Tensor::from_vector({1, 4, 128, 64}, naive::random_normal(4 * 128 * 64, 9)).to(DType::bf16)}};
  const RunResult cpu = Executor(g).run(host);
  const RunResult automatic = Executor(g, ExecOptions{.attention = AttentionBackend::automatic}).run(upload(host));
  const RunResult flash = Executor(g, ExecOptions{.attention = AttentionBackend::flash}).run(upload(host));
  const bool has_cudnn = cuda::cudnn_sdpa_unsupported<cuda::bf16>(1, 4, 4, 128, 128, 64, true).empty();
  const RunResult chosen =
      has_cudnn ? Executor(g, ExecOptions{.attention = AttentionBackend::cudnn}).run(upload(host)) : flash;
  check_tensor("sdpa auto = the backend it picks", automatic.outputs.begin()->second,
               down(chosen.outputs.begin()->second), 0);
  check_tensor("sdpa auto, against the CPU", automatic.outputs.begin()->second, cpu.outputs.begin()->second, 2e-2);
}
