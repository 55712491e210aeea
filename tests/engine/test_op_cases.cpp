// Every op of the op table, run through the builder and the executor on symbolic shapes, against
// the naive double-precision references of the op-case table (tests/common/op_cases.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <set>

#include "common/op_cases.h"
#include "graph/verify.h"
#include "engine/dispatch.h"
#include "engine/executor.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/kernel_test.h"
#include "tensor/convert.h"

using namespace autosp;
using namespace autosp::testing;

namespace {

double max_rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double scale = 1e-30, err = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
  return err / scale;
}

// How many entries of got differ from want (a readable failure for tensors too large to print).
size_t mismatches(const std::vector<double>& got, const std::vector<double>& want) {
  size_t n = got.size() == want.size() ? 0 : std::max(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) n += got[i] != want[i];
  return n;
}

struct Prepared {
  Graph g;
  TensorMap feeds;
  std::vector<Vec> values;
  std::vector<naive::Shape> shapes;
};

std::unique_ptr<Prepared> prepare(const OpCase& c, DType dt, uint32_t seed) {
  auto p = std::make_unique<Prepared>();
  Builder b(p->g);
  std::vector<Node*> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& spec = c.inputs[i];
    const std::string name = "in" + std::to_string(i);
    ins.push_back(b.input(name, spec.ids ? DType::i64 : dt, spec.shape, Role::none));
    naive::Shape shape;
    for (const auto& d : spec.shape) shape.push_back(d.eval(op_case_bindings()));
    const int64_t n = naive::numel(shape);
    Vec v = spec.ids ? naive::random_uniform(n, seed + i, static_cast<double>(spec.lo), static_cast<double>(spec.hi))
                     : naive::random_normal(n, seed + i);
    if (spec.ids) {
      for (auto& x : v) x = std::floor(x);
      if (spec.ignore)
        for (size_t k = 0; k < v.size(); k += 3) v[k] = -100;
      p->feeds[name] = Tensor::from_vector(shape, as_ids(v));
    } else {
      p->feeds[name] = Tensor::from_vector(shape, v).to(dt);
      v = p->feeds[name].to_doubles();  // the reference sees exactly what the kernel sees
    }
    p->values.push_back(v);
    p->shapes.push_back(shape);
  }
  p->g.add_output(c.build(b, ins));
  return p;
}

}  // namespace

TEST_CASE("the op-case table covers every forward op", "[ops]") {
  std::set<Op> covered{Op::input, Op::parameter};
  for (const auto& c : op_cases()) covered.insert(c.op);
  for (size_t i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    if (op_info(op).backward_only) continue;  // reached through the vjp rules (test_gradcheck)
    INFO("op " << op_name(op));
    CHECK(covered.count(op) == 1);
  }
}

TEST_CASE("ops match naive references through the executor", "[ops][executor]") {
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-12 : 2e-6;
    for (const auto& c : op_cases()) {
      DYNAMIC_SECTION(c.name << " " << dtype_name(dt)) {
        auto p = prepare(c, dt, 7);
        verify(p->g);
        Executor ex(p->g);
        RunResult r = ex.run(p->feeds, single_groups());
        const Tensor& out = r.outputs.at(p->g.outputs()[0]->name());
        CHECK(out.shape() == eval_shape(p->g.outputs()[0]->shape(), op_case_bindings()));
        Vec want = c.ref(p->values, p->shapes);
        Vec got = out.to_doubles();
        REQUIRE(got.size() == want.size());
        CHECK(max_rel_error(got, want) < tol);
      }
    }
  }
}

// bf16 on CPU is f32 compute with one rounding per result (dispatch.cpp): each op's bf16 output
// must be exactly the bf16 rounding (naive, ties to even) of its f32 kernel's output on the same
// values, and within one bf16 rounding (unit roundoff 2^-8, relative to the largest entry) of the
// float64 reference. Outputs the op table keeps in f32 (a loss sum, a count) are not rounded. The
// ops the CPU computes on its bf16 units where it has them (engine/launchers.h native_bf16: the
// matmul and the tiled loss's logits sum in another order than the f32 GEMM; the tiled MLP also
// rounds its hidden h to bf16; the attention, ring attention's too, its probabilities and dS) are
// within one bf16 step
// (2^-7 of the largest entry) of that instead.
TEST_CASE("ops on bf16 inputs compute in f32 and round once", "[ops][executor][bf16]") {
  for (const auto& c : op_cases()) {
    DYNAMIC_SECTION(c.name) {
      auto p = prepare(c, DType::bf16, 7);
      verify(p->g);
      const Node* out_node = p->g.outputs()[0];
      const Tensor out = Executor(p->g).run(p->feeds, single_groups()).outputs.at(out_node->name());
      CHECK(out.dtype() == out_node->dtype());
      const Vec got = out.to_doubles();
      const Vec want = c.ref(p->values, p->shapes);
      REQUIRE(got.size() == want.size());
      CHECK(max_rel_error(got, want) < (out.dtype() == DType::bf16 ? 4e-3 : 2e-5));

      // The same values as f32 through the f32 kernels, then rounded (or not) like the node's dtype.
      auto p32 = prepare(c, DType::f32, 7);
      for (auto& [name, t] : p32->feeds)
        if (t.dtype() == DType::f32) t = p->feeds.at(name).to(DType::f32);
      const Node* out32 = p32->g.outputs()[0];
      Vec want32 = Executor(p32->g).run(p32->feeds, single_groups()).outputs.at(out32->name()).to_doubles();
      if (out.dtype() == DType::bf16 && out32->dtype() != DType::bf16) want32 = naive::map(want32, naive::round_bf16);
      INFO("bf16 output " << out.str() << " vs the f32 kernel's " << out32->type().str());
      const bool native = c.op == Op::matmul || c.op == Op::swiglu_mlp || c.op == Op::sdpa || c.op == Op::sdpa_backward ||
                          c.op == Op::ring_attention || c.op == Op::linear_cross_entropy_sum ||
                          c.op == Op::moe_experts || c.op == Op::moe_experts_ep;
      // The fused add + norms normalise their bf16-rounded sum (decision 270): exact against that
      // composition in the row-chunk test below, within one bf16 step of the f32 kernel here.
      const bool rounds_sum = c.op == Op::add_layernorm || c.op == Op::add_rmsnorm;
      if ((native && cpu::bf16_gemm_best() != cpu::Bf16Gemm::f32) || rounds_sum)
        CHECK(max_rel_error(got, want32) <= 0x1p-7);
      else
        CHECK(got == want32);
    }
  }
}

// A bf16 moe_experts_ep node (here over an expert group of one: its exchange runs through the
// single-process communicator) runs the bf16 experts natively (engine/expert_parallel.h
// moe_ep_forward_bf16, decision 264): the bits of the bf16 moe_experts node on the same values, and
// the run log does not list it; gpt-oss's biased, clamped experts too (decision 279), in both ops.
TEST_CASE("bf16 moe_experts_ep and moe_experts nodes run the bf16 experts natively (gpt-oss's too)",
          "[ops][executor][bf16][ep]") {
  const auto find = [](const std::string& name) {
    for (const OpCase& c : op_cases())
      if (c.name == name) return c;
    FAIL("no op case " << name);
    return op_cases().front();
  };
  const auto output = [](Prepared& p) {
    return Executor(p.g).run(p.feeds, single_groups()).outputs.at(p.g.outputs()[0]->name()).to_doubles();
  };
  const bool native = cpu::bf16_gemm_best() != cpu::Bf16Gemm::f32;
  const std::vector<std::string> none, ep_op{"moe_experts_ep"}, one_op{"moe_experts"};
  for (const std::string suffix : {"norm", "gptoss"}) {
    INFO(suffix);
    auto one = prepare(find("moe_experts_" + suffix), DType::bf16, 11);
    auto ep = prepare(find("moe_experts_ep_" + suffix), DType::bf16, 11);
    CHECK(output(*ep) == output(*one));
    CHECK(cpu_bf16_emulated_ops(ep->g) == (native ? none : ep_op));
    CHECK(cpu_bf16_emulated_ops(one->g) == (native ? none : one_op));
  }
}

// A bf16 sdpa node runs the bf16 attention kernel (its bits) where the CPU has it and the head dim
// is even and at least 32 (kernels/cpu/attention.h sdpa_bf16_preferred), and the emulation (the
// f32 kernel on widened values, rounded once) otherwise: the two differ (P is rounded to bf16 in
// one), so the bits tell which ran.
TEST_CASE("bf16 sdpa nodes run on the bf16 attention where the CPU offers it", "[ops][executor][bf16]") {
  for (const int64_t D : {int64_t(32), int64_t(16), int64_t(15)}) {
    const int64_t B = 1, N = 2, S = 40, n = B * N * S * D;
    Graph g;
    Builder b(g);
    Node* q = b.input("q", DType::bf16, {B, N, S, D}, Role::none);
    Node* k = b.input("k", DType::bf16, {B, N, S, D}, Role::none);
    Node* v = b.input("v", DType::bf16, {B, N, S, D}, Role::none);
    g.add_output(b.sdpa(q, k, v, true, 0.25));
    TensorMap feeds;
    for (auto [name, seed] : {std::pair{"q", 61u}, {"k", 62u}, {"v", 63u}})
      feeds.emplace(name, Tensor::from_vector({B, N, S, D}, naive::random_normal(n, seed, 2.0)).to(DType::bf16));
    const Tensor got = Executor(g).run(feeds, single_groups()).outputs.begin()->second;
    std::vector<uint16_t> native(static_cast<size_t>(n)), emulated(static_cast<size_t>(n));
    std::vector<float> lse(static_cast<size_t>(B * N * S)), wide(static_cast<size_t>(n));
    const auto bits = [&](const char* name) { return feeds.at(name).data<uint16_t>(); };
    const auto f32 = [&](const char* name) { return feeds.at(name).to(DType::f32); };
    const Tensor qf = f32("q"), kf = f32("k"), vf = f32("v");
    cpu::sdpa_forward<float>(qf.data<float>(), kf.data<float>(), vf.data<float>(), wide.data(), lse.data(), B, N, N, S,
                             S, D, 0.25, true);
    cpu::cast<float, uint16_t>(wide.data(), emulated.data(), n);
    const std::vector<uint16_t> out(got.data<uint16_t>(), got.data<uint16_t>() + n);
    INFO("D " << D);
    CHECK(cpu::sdpa_bf16_preferred(D) == (D >= 32 && cpu::sdpa_bf16_native(D)));
    if (!cpu::sdpa_bf16_preferred(D)) {
      if (D == 32) WARN("SKIPPED: the bf16 attention (this CPU lacks AVX512-BF16); checking the emulation");
      CHECK(out == emulated);
      continue;
    }
    cpu::sdpa_forward_bf16(bits("q"), bits("k"), bits("v"), native.data(), lse.data(), B, N, N, S, S, D, 0.25, true);
    REQUIRE(native != emulated);  // else the check below could not tell the paths apart
    CHECK(out == native);
  }
}

// Same-shape elementwise ops on bf16 run in widened chunks of 4096 (engine/cpu/launchers.cpp
// by_chunks_bf16): over several chunks and a partial one, and across threads, each result is still
// exactly the f32 kernel's on the whole tensor, rounded once.
TEST_CASE("bf16 elementwise ops in chunks equal the f32 kernels rounded once", "[ops][executor][bf16]") {
  const std::vector<std::pair<std::string, std::function<Node*(Builder&, Node*, Node*)>>> ops = {
      {"add", [](Builder& b, Node* x, Node* y) { return b.add(x, y); }},
      {"mul", [](Builder& b, Node* x, Node* y) { return b.mul(x, y); }},
      {"silu", [](Builder& b, Node* x, Node*) { return b.silu(x); }},
      {"gelu_tanh", [](Builder& b, Node* x, Node*) { return b.gelu_tanh(x); }},
      {"silu_backward", [](Builder& b, Node* x, Node* y) { return b.silu_backward(y, x); }},
      {"swiglu", [](Builder& b, Node* x, Node* y) { return b.swiglu(x, y); }},
      {"swiglu_backward dg", [](Builder& b, Node* x, Node* y) { return b.swiglu_backward(y, x, y); }},
      {"swiglu_backward du", [](Builder& b, Node* x, Node* y) { return b.output(b.swiglu_backward(y, x, y), 1, "du"); }},
  };
  const Shape shape{3, 5000};  // 15,000 elements: three chunks of 4096 and one of 2712
  for (const auto& [name, build] : ops) {
    DYNAMIC_SECTION(name) {
      auto run = [&](DType dt, const TensorMap& feeds) {
        Graph g;
        Builder b(g);
        g.add_output(build(b, b.input("x", dt, {shape[0], shape[1]}, Role::none),
                           b.input("y", dt, {shape[0], shape[1]}, Role::none)));
        return Executor(g).run(feeds, single_groups()).outputs.begin()->second.to_doubles();
      };
      TensorMap feeds{{"x", Tensor::from_vector(shape, naive::random_normal(15000, 41, 2.0)).to(DType::bf16)},
                      {"y", Tensor::from_vector(shape, naive::random_normal(15000, 42)).to(DType::bf16)}};
      TensorMap wide{{"x", feeds.at("x").to(DType::f32)}, {"y", feeds.at("y").to(DType::f32)}};
      const Vec want = naive::map(run(DType::f32, wide), naive::round_bf16);
      test::with_threads({1, 2}, [&](int t) {
        INFO("threads " << t);
        CHECK(run(DType::bf16, feeds) == want);
      });
    }
  }
}

// Dropout on bf16 (LoRA's lora_dropout on a bf16 base) runs in widened chunks of whole rows with
// each chunk's token indices (engine/cpu/launchers.cpp dropout_bf16): over many chunks and across
// threads, each result is exactly the f32 kernel's on the whole tensor rounded once, within one
// bf16 rounding of the float64 mask, and the run log no longer calls dropout emulated.
TEST_CASE("bf16 dropout in row chunks equals the f32 kernel rounded once", "[ops][executor][bf16]") {
  const int64_t B = 3, R = 700, C = 96, n = B * R * C;  // 42 rows a chunk: 50 chunks
  std::vector<double> ids(static_cast<size_t>(B * R));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = double((i * 7919 + 13) % 100003);
  const auto build = [&](Graph& g, DType dt) {
    Builder b(g);
    g.add_output(b.dropout(b.input("x", dt, {B, R, C}, Role::none), b.input("t", DType::i64, {B, R}, Role::none),
                           0.375, 77));
  };
  const auto run = [&](DType dt, const TensorMap& feeds) {
    Graph g;
    build(g, dt);
    return Executor(g).run(feeds, single_groups()).outputs.begin()->second.to_doubles();
  };
  const Tensor x = Tensor::from_vector({B, R, C}, naive::random_normal(n, 43, 2.0)).to(DType::bf16);
  const Tensor t = Tensor::from_vector({B, R}, as_ids(ids));
  const Vec want = naive::map(run(DType::f32, {{"x", x.to(DType::f32)}, {"t", t}}), naive::round_bf16);
  const Vec exact = naive::dropout(x.to_doubles(), as_ids(ids), C, 0.375, 77);
  REQUIRE(std::count(exact.begin(), exact.end(), 0.0) > n / 4);  // the mask drops about 3/8
  test::with_threads({1, 2}, [&](int threads) {
    INFO("threads " << threads);
    const Vec got = run(DType::bf16, {{"x", x}, {"t", t}});
    CHECK(got == want);
    CHECK(max_rel_error(got, exact) < 0x1p-8);
  });
  Graph g;
  build(g, DType::bf16);
  CHECK(cpu_bf16_emulated_ops(g).empty());
}

// Norms, softmax and rope on bf16 run in widened chunks of whole rows (engine/cpu/launchers.cpp
// norm_bf16, softmax_bf16, rope_bf16): over many chunks, rope's chunks crossing (b, n) planes, and across
// threads, each result is exactly the f32 kernel's on the whole tensor, rounded once (the fused
// add + norms': the f32 norm of the rounded sum, rounded, as the unfused ops give). The norms'
// parameter gradients are summed over blocks of 64 rows in f32 partials: within one bf16 step
// (2^-7 of the largest entry) of that.
TEST_CASE("bf16 norms and rope in row chunks equal the f32 kernels rounded once", "[ops][executor][bf16]") {
  const int64_t R = 700, C = 96;  // x [3, R, C]: 2,100 rows (33 blocks of 64), 42 rows a chunk
  struct Case {
    std::string name;
    std::function<std::vector<Node*>(Builder&, Node*, Node*, Node*, Node*)> build;  // x, y, w, b
    size_t inexact_from;  // outputs from this index sum over rows
    // The f32 graph whose outputs, rounded once, the bf16 ones equal (null: `build`'s own).
    std::function<std::vector<Node*>(Builder&, Node*, Node*, Node*, Node*)> reference = nullptr;
  };
  // The fused add + norms' reference: the unfused add, its sum rounded to bf16 (as stored), the norm
  // of that (decision 270).
  const auto rounded_sum = [](Builder& b, Node* x, Node* y) {
    return b.cast(b.cast(b.add(x, y), DType::bf16), DType::f32);
  };
  const std::vector<Case> cases = {
      {"rmsnorm", [](Builder& b, Node* x, Node*, Node* w, Node*) { return std::vector{b.rmsnorm(x, w, 1e-6)}; }, 9},
      {"layernorm", [](Builder& b, Node* x, Node*, Node* w, Node* bb) { return std::vector{b.layernorm(x, w, bb, 1e-5)}; }, 9},
      {"add_rmsnorm", [](Builder& b, Node* x, Node* y, Node* w, Node*) {
         Node* n = b.add_rmsnorm(x, y, w, 1e-6);
         return std::vector{n, b.output(n, 1, "sum")};
       }, 9, [&](Builder& b, Node* x, Node* y, Node* w, Node*) {
         Node* s = rounded_sum(b, x, y);
         return std::vector{b.rmsnorm(s, w, 1e-6), s};
       }},
      {"add_layernorm", [](Builder& b, Node* x, Node* y, Node* w, Node* bb) {
         Node* n = b.add_layernorm(x, y, w, bb, 1e-5);
         return std::vector{n, b.output(n, 1, "sum")};
       }, 9, [&](Builder& b, Node* x, Node* y, Node* w, Node* bb) {
         Node* s = rounded_sum(b, x, y);
         return std::vector{b.layernorm(s, w, bb, 1e-5), s};
       }},
      {"rmsnorm_backward", [](Builder& b, Node* x, Node* y, Node* w, Node*) {
         Node* n = b.rmsnorm_backward(y, x, w, 1e-6);
         return std::vector{n, b.output(n, 1, "dw")};
       }, 1},
      {"layernorm_backward", [](Builder& b, Node* x, Node* y, Node* w, Node*) {
         Node* n = b.layernorm_backward(y, x, w, 1e-5);
         return std::vector{n, b.output(n, 1, "dw"), b.output(n, 2, "db")};
       }, 1},
      {"softmax", [](Builder& b, Node* x, Node*, Node*, Node*) { return std::vector{b.softmax(x)}; }, 9},
      {"softmax_backward", [](Builder& b, Node* x, Node* y, Node*, Node*) {  // x stands for the softmax's output
         return std::vector{b.softmax_backward(y, x)};
       }, 9},
  };
  const Shape shape{3, R, C};
  const Vec xs = naive::random_normal(3 * R * C, 51, 2.0), ys = naive::random_normal(3 * R * C, 52);
  const Vec ws = naive::random_normal(C, 53), bs = naive::random_normal(C, 54);
  auto feeds_of = [&](DType dt) {
    auto t = [&](Shape sh, const Vec& v) {  // bf16 values, in dt
      return Tensor::from_vector(sh, v).to(DType::bf16).to(dt);
    };
    return TensorMap{{"x", t(shape, xs)}, {"y", t(shape, ys)}, {"w", t({C}, ws)}, {"b", t({C}, bs)}};
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      auto run = [&](DType dt) {
        Graph g;
        Builder b(g);
        Node* x = b.input("x", dt, {3, R, C}, Role::none);
        Node* y = b.input("y", dt, {3, R, C}, Role::none);
        Node* w = b.input("w", dt, {C}, Role::none);
        Node* bb = b.input("b", dt, {C}, Role::none);
        const std::vector<Node*> outs = (dt == DType::f32 && c.reference ? c.reference : c.build)(b, x, y, w, bb);
        for (Node* o : outs) g.add_output(o);
        const TensorMap got = Executor(g).run(feeds_of(dt), single_groups()).outputs;
        std::vector<Vec> v;
        for (Node* o : outs) v.push_back(got.at(o->name()).to_doubles());
        return v;
      };
      std::vector<Vec> want = run(DType::f32);
      for (Vec& v : want) v = naive::map(v, naive::round_bf16);
      test::with_threads({1, 2}, [&](int t) {
        const std::vector<Vec> got = run(DType::bf16);
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          INFO("threads " << t << ", output " << i);
          if (i < c.inexact_from) CHECK(got[i] == want[i]);
          else CHECK(max_rel_error(got[i], want[i]) <= 0x1p-7);
        }
      });
    }
  }
  for (const bool backward : {false, true}) {
    DYNAMIC_SECTION((backward ? "rope_backward" : "rope")) {
      const int64_t B = 2, N = 3, S = 50, D = 64;  // planes of 3,200 elements; chunks of 4,096
      std::vector<int64_t> pos(size_t(B * S));
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = int64_t((i * 37) % 301);
      const Vec v = naive::random_normal(B * N * S * D, 55);
      auto run = [&](DType dt) {
        Graph g;
        Builder b(g);
        Node* x = b.input("x", dt, {B, N, S, D}, Role::none);
        Node* p = b.input("pos", DType::i64, {B, S}, Role::none);
        g.add_output(backward ? b.rope_backward(x, p, 10000.0) : b.rope(x, p, 10000.0));
        const TensorMap feeds{{"x", Tensor::from_vector({B, N, S, D}, v).to(DType::bf16).to(dt)},
                              {"pos", Tensor::from_vector({B, S}, pos)}};
        return Executor(g).run(feeds, single_groups()).outputs.begin()->second.to_doubles();
      };
      const Vec want = naive::map(run(DType::f32), naive::round_bf16);
      test::with_threads({1, 2}, [&](int t) {
        INFO("threads " << t);
        CHECK(run(DType::bf16) == want);
      });
    }
  }
}

// Broadcasting add, sub, mul, div on bf16 (engine/cpu/launchers.cpp broadcast_binary_bf16): chunks
// of whole output rows, each operand's part widened (a bias [C], a gate [.., 1], leading and middle
// broadcasts, either operand broadcast). At 1 and 2 threads each result is exactly the f32
// kernel's on the widened values, rounded once, and within one bf16 rounding of float64.
TEST_CASE("bf16 broadcasting binary ops equal the f32 kernels rounded once", "[ops][executor][bf16]") {
  const int64_t R = 700, C = 96;
  const naive::Shape full{3, R, C};
  const std::vector<std::pair<naive::Shape, naive::Shape>> shapes = {
      {full, {C}}, {full, {3, R, 1}}, {{3, 1, C}, full}, {full, {R, C}}, {{3, R, 1}, {1, 1, C}}};
  const std::vector<std::pair<std::string, char>> ops = {{"add", '+'}, {"sub", '-'}, {"mul", '*'}, {"div", '/'}};
  for (size_t k = 0; k < shapes.size(); ++k) {
    for (const auto& [name, op] : ops) {
      const auto& [sa, sb] = shapes[k];
      DYNAMIC_SECTION(name << " shapes " << k) {
        const Vec a = naive::map(naive::random_normal(naive::numel(sa), 81 + uint32_t(k), 2.0), naive::round_bf16);
        Vec b = naive::map(naive::random_normal(naive::numel(sb), 91 + uint32_t(k)), naive::round_bf16);
        if (op == '/') b = naive::map(b, [](double v) { return v < 0 ? v - 0.5 : v + 0.5; });  // away from 0
        b = naive::map(b, naive::round_bf16);
        auto run = [&](DType dt) {
          Graph g;
          Builder bld(g);
          auto sym = [](const naive::Shape& s) { return SymShape(s.begin(), s.end()); };
          Node* x = bld.input("a", dt, sym(sa), Role::none);
          Node* y = bld.input("b", dt, sym(sb), Role::none);
          Node* out = op == '+' ? bld.add(x, y) : op == '-' ? bld.sub(x, y)
                    : op == '*' ? bld.mul(x, y) : bld.div(x, y);
          g.add_output(out);
          const TensorMap feeds{{"a", Tensor::from_vector(sa, a).to(dt)}, {"b", Tensor::from_vector(sb, b).to(dt)}};
          return Executor(g).run(feeds, single_groups()).outputs.at(out->name()).to_doubles();
        };
        const auto f = [op](double u, double v) {
          return op == '+' ? u + v : op == '-' ? u - v : op == '*' ? u * v : u / v;
        };
        const Vec want = naive::map(run(DType::f32), naive::round_bf16);
        CHECK(max_rel_error(want, naive::broadcast_binary(a, sa, b, sb, f)) < 4e-3);
        test::with_threads({1, 2}, [&](int t) {
          INFO("threads " << t);
          CHECK(mismatches(run(DType::bf16), want) == 0);
        });
      }
    }
  }
}

// GPT-2's bf16 ops that read bf16 without a whole widened copy (engine/cpu/launchers.cpp:
// bias_gelu_tanh_bf16 by chunks of rows; sum_to, embedding and its backward in kernels that read
// bf16 and sum in double; the untiled loss row by row): at 1 and 2 threads each result is exactly
// the f32 kernel's on the widened values, rounded once (the loss sum kept f32, not rounded), and
// within one bf16 rounding of the float64 reference.
TEST_CASE("bf16 bias + GELU, sum_to, the embedding and the loss equal the f32 kernels rounded once",
          "[ops][executor][bf16]") {
  const int64_t R = 700, C = 96, V = 50;  // x [3, R, C]: 2,100 rows, 42 rows a chunk
  const naive::Shape shape{3, R, C};
  const Vec xs = naive::random_normal(3 * R * C, 71, 2.0), ys = naive::random_normal(3 * R * C, 72);
  const Vec bs = naive::random_normal(C, 73), ws = naive::random_normal(V * C, 74);
  std::vector<int64_t> ids(size_t(3 * R));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t((i * 7 + i / 13) % size_t(V - 3));  // 3 rows unused
  const auto bf16_values = [](const Vec& v) { return naive::map(v, naive::round_bf16); };
  const Vec x = bf16_values(xs), y = bf16_values(ys), bias = bf16_values(bs), w = bf16_values(ws);
  const auto embedding_grad = [&] {
    Vec g(size_t(V * C), 0.0);
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t c = 0; c < C; ++c) g[size_t(ids[i] * C + c)] += y[i * size_t(C) + size_t(c)];
    return g;
  };
  const auto per_element = [&](const std::function<double(size_t)>& f) {
    Vec out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = f(i);
    return out;
  };
  struct Case {
    std::string name;
    std::function<Node*(Builder&, Node*, Node*, Node*, Node*, Node*)> build;  // x, y, b, w, ids
    std::function<Vec()> ref;
  };
  const std::vector<Case> cases = {
      {"bias_gelu_tanh", [](Builder& b, Node* x, Node*, Node* bb, Node*, Node*) { return b.bias_gelu_tanh(x, bb); },
       [&] { return per_element([&](size_t i) { return naive::gelu_tanh(x[i] + bias[i % size_t(C)]); }); }},
      {"bias_gelu_tanh_backward",
       [](Builder& b, Node* x, Node* y, Node* bb, Node*, Node*) { return b.bias_gelu_tanh_backward(y, x, bb); },
       [&] { return per_element([&](size_t i) { return y[i] * naive::gelu_tanh_grad(x[i] + bias[i % size_t(C)]); }); }},
      {"sum_to bias", [C](Builder& b, Node* x, Node*, Node*, Node*, Node*) { return b.sum_to(x, {C}); },
       [&] { return naive::sum_to(x, shape, {1, 1, C}); }},
      {"sum_to rows", [](Builder& b, Node* x, Node*, Node*, Node*, Node*) { return b.sum_to(x, {3, 1, 1}); },
       [&] { return naive::sum_to(x, shape, {3, 1, 1}); }},
      {"sum_to all", [](Builder& b, Node* x, Node*, Node*, Node*, Node*) { return b.sum_to(x, {}); },
       [&] { return naive::sum_to(x, shape, {1, 1, 1}); }},
      {"embedding", [](Builder& b, Node*, Node*, Node*, Node* w, Node* ids) { return b.embedding(w, ids); },
       [&] { return naive::embedding(w, ids, C); }},
      {"embedding_backward",
       [V](Builder& b, Node*, Node* y, Node*, Node*, Node* ids) { return b.embedding_backward(y, ids, V); },
       embedding_grad},
      {"cross_entropy_sum", [](Builder& b, Node* x, Node*, Node*, Node*, Node* ids) { return b.cross_entropy_sum(x, ids); },
       [&] { return Vec{naive::cross_entropy(x, ids, 3 * R, C)}; }},
      {"cross_entropy_backward",
       [](Builder& b, Node* x, Node*, Node*, Node*, Node* ids) {
         return b.cross_entropy_backward(x, ids, b.full({}, 0.5, DType::f32), -100);
       },
       [&] { return naive::cross_entropy_backward(x, ids, 3 * R, C, 0.5); }},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      auto run = [&](DType dt) {
        Graph g;
        Builder b(g);
        Node* out = c.build(b, b.input("x", dt, {3, R, C}, Role::none), b.input("y", dt, {3, R, C}, Role::none),
                            b.input("b", dt, {C}, Role::none), b.input("w", dt, {V, C}, Role::none),
                            b.input("ids", DType::i64, {3, R}, Role::none));
        g.add_output(out);
        const TensorMap feeds{{"x", Tensor::from_vector(shape, x).to(dt)}, {"y", Tensor::from_vector(shape, y).to(dt)},
                              {"b", Tensor::from_vector({C}, bias).to(dt)}, {"w", Tensor::from_vector({V, C}, w).to(dt)},
                              {"ids", Tensor::from_vector({3, R}, ids)}};
        const Tensor t = Executor(g).run(feeds, single_groups()).outputs.at(out->name());
        CHECK(t.dtype() == (c.name == "cross_entropy_sum" ? DType::f32 : dt));  // the loss stays f32
        return t.to_doubles();
      };
      const Vec ref = c.ref();
      test::with_threads({1, 2}, [&](int t) {  // the f32 loss sum's bits depend on the thread count
        INFO("threads " << t);
        Vec want = run(DType::f32);
        if (c.name != "cross_entropy_sum") want = naive::map(want, naive::round_bf16);
        CHECK(max_rel_error(want, ref) < 4e-3);
        CHECK(mismatches(run(DType::bf16), want) == 0);
      });
    }
  }
}

// DPO's sequence sums on bf16 logits (engine/cpu/launchers.cpp sequence_logps_bf16): the f32 sums
// exactly the f32 kernel's on the widened logits, dlogits its bits rounded once, at 1 and 2
// threads; the sums within f32 rounding of the float64 reference.
TEST_CASE("bf16 sequence_logps and its backward equal the f32 kernels", "[ops][executor][bf16]") {
  const int64_t B = 3, S = 40, V = 300, K = 2;  // 120 rows of 300 logits
  const Vec logits = naive::map(naive::random_normal(B * S * V, 75, 2.0), naive::round_bf16);
  const Vec grad = naive::random_normal(B * 2 * K, 76);
  std::vector<int64_t> labels(size_t(B * S)), slots(size_t(B * S));
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] = i % 7 == 3 ? -100 : int64_t((i * 31) % size_t(V));
    slots[i] = int64_t(i % 5) - 2;  // −2 … 2: both sides of both slots, and unscored rows
  }
  auto run = [&](DType dt, bool backward) {
    Graph g;
    Builder b(g);
    Node* fwd = b.sequence_logps(b.input("logits", dt, {B, S, V}, Role::none), b.input("labels", DType::i64, {B, S}, Role::none),
                                 b.input("slots", DType::i64, {B, S}, Role::none), K);
    Node* out = backward ? b.sequence_logps_backward(fwd, b.input("grad", DType::f32, {B, 2, K}, Role::none)) : fwd;
    g.add_output(out);
    TensorMap feeds{{"logits", Tensor::from_vector({B, S, V}, logits).to(dt)},
                    {"labels", Tensor::from_vector({B, S}, labels)},
                    {"slots", Tensor::from_vector({B, S}, slots)}};
    if (backward) feeds.emplace("grad", Tensor::from_vector({B, 2, K}, grad).to(DType::f32));
    const Tensor t = Executor(g).run(feeds, single_groups()).outputs.at(out->name());
    CHECK(t.dtype() == (backward ? dt : DType::f32));
    return t.to_doubles();
  };
  CHECK(max_rel_error(run(DType::f32, false), naive::sequence_logps(logits, labels, slots, B, S, V, K)) < 2e-6);
  test::with_threads({1, 2}, [&](int t) {
    INFO("threads " << t);
    CHECK(run(DType::bf16, false) == run(DType::f32, false));
    CHECK(mismatches(run(DType::bf16, true), naive::map(run(DType::f32, true), naive::round_bf16)) == 0);
  });
}

TEST_CASE("the executor binds symbols and rejects inconsistent feeds", "[executor]") {
  const OpCase& c = op_cases().front();  // embedding: weight [11, 4], ids [B, S]
  auto p = prepare(c, DType::f32, 3);
  Executor ex(p->g);
  Bindings b = ex.bind(p->feeds);
  CHECK(b.at("B") == 2);
  CHECK(b.at("S") == 5);

  TensorMap wrong_shape = p->feeds;
  wrong_shape["in0"] = Tensor::zeros({12, 4}, DType::f32);
  CHECK_THROWS_WITH(ex.run(wrong_shape), Catch::Contains("in0") && Catch::Contains("[11, 4]"));
  TensorMap wrong_dtype = p->feeds;
  wrong_dtype["in0"] = Tensor::zeros({11, 4}, DType::f64);
  CHECK_THROWS_WITH(ex.run(wrong_dtype), Catch::Contains("f64[11, 4]"));
  TensorMap missing = p->feeds;
  missing.erase("in1");
  CHECK_THROWS_WITH(ex.run(missing), Catch::Contains("no tensor fed") && Catch::Contains("in1"));
  TensorMap bad_ids = p->feeds;
  bad_ids["in1"] = Tensor::from_vector<int64_t>({1, 2}, {3, 11});
  CHECK_THROWS_AS(ex.run(bad_ids), UsageError);
}

TEST_CASE("a violated assumption is a clear error", "[executor]") {
  Graph g;
  Builder b(g);
  const Dim S = Dim::sym("S");
  Node* x = b.input("x", DType::f32, {S, 4}, Role::none);
  g.assume({S, 4});
  g.add_output(b.reshape(x, {S / 4, 16}));
  Executor ex(g);
  CHECK_THROWS_WITH(ex.run({{"x", Tensor::zeros({6, 4}, DType::f32)}}),
                    Catch::Contains("S % 4 == 0") && Catch::Contains("S = 6"));
  RunResult r = ex.run({{"x", Tensor::zeros({8, 4}, DType::f32)}});
  CHECK(r.outputs.begin()->second.shape() == Shape{2, 16});
}

TEST_CASE("the executor frees intermediates after their last use", "[executor]") {
  // x [S, 1024] → 6 chained negations: a naive executor would hold 7 buffers at once.
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f64, {Dim::sym("S"), 1024}, Role::none);
  Node* y = x;
  for (int i = 0; i < 6; ++i) y = b.neg(y);
  g.add_output(y);
  Executor ex(g);
  Tensor in = Tensor::zeros({64, 1024}, DType::f64);
  RunResult r = ex.run({{"x", in}});
  CHECK(r.peak_bytes >= 3 * in.nbytes());
  CHECK(r.peak_bytes < 4 * in.nbytes());  // input + at most two live values
}

// The run log names the bf16 program's ops that are emulated (engine/dispatch.h
// cpu_bf16_emulated_ops): here a silu (read bf16 everywhere), a matmul (on the bf16 units where the
// CPU has them, else widened) and the router statistics (no bf16 launcher); an f32 program has none.
TEST_CASE("the bf16 run log names the program's emulated ops", "[executor][bf16]") {
  for (const DType dt : {DType::bf16, DType::f32}) {
    Graph g;
    Builder b(g);
    Node* x = b.input("x", dt, {8, 4}, Role::none);
    Node* w = b.input("w", dt, {4, 4}, Role::none);
    Node* y = b.matmul(b.silu(x), w, false, true);
    g.add_output(y);
    g.add_output(b.moe_router_stats(b.softmax(y), 2));
    std::vector<std::string> want;
    if (dt == DType::bf16) {
      if (cpu::bf16_gemm_best() == cpu::Bf16Gemm::f32) want.push_back("matmul");
      want.push_back("moe_router_stats");
    }
    INFO(dtype_name(dt));
    CHECK(cpu_bf16_emulated_ops(g) == want);
    const std::string line = cpu_bf16_numerics(g);
    for (const std::string& op : want) CHECK_THAT(line, Catch::Contains(op));
    CHECK_THAT(line, !Catch::Contains("silu"));
  }
}
