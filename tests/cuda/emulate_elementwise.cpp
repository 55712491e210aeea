// The CUDA elementwise launchers run on the CPU by emulation.h, against the CPU kernels: every
// unary op and gradient, broadcasting binary ops, strided copies, sum_to through each of its paths
// (a copy, thread and warp partials with and without chunks) and sum_squares.
#include "cuda/emulation.h"
//
#include "kernels/cuda/elementwise.cu"
//
#include "cuda/cuda_test.h"
#include "kernels/cpu/elementwise.h"

using namespace autosp;
using namespace autosp::cudatest;

TEMPLATE_TEST_CASE("emulated elementwise launchers match the CPU", "[cuda-emulation][elementwise]", float, double,
                   cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  const int64_t n = 777;
  const auto x = values<T>(naive::random_normal(n, 2100, 1.5)), pos = values<T>(naive::random_uniform(n, 2101, 0.1, 3));
  const auto xs = to_storage<T>(x), ps = to_storage<T>(pos);
  std::vector<T> y(static_cast<size_t>(n));
  std::vector<H> ref(static_cast<size_t>(n));
  for (cpu::Unary op :
       {cpu::Unary::neg, cpu::Unary::exp, cpu::Unary::log, cpu::Unary::tanh, cpu::Unary::sqrt, cpu::Unary::rsqrt,
        cpu::Unary::square, cpu::Unary::gelu_tanh, cpu::Unary::silu, cpu::Unary::scale, cpu::Unary::relu}) {
    INFO("unary " << int(op));
    const bool positive = op == cpu::Unary::log || op == cpu::Unary::sqrt || op == cpu::Unary::rsqrt;
    cpu::unary<H>(op, (positive ? pos : x).data(), ref.data(), n, 0.3);
    cuda::unary<T>(op, (positive ? ps : xs).data(), y.data(), n, 0.3, nullptr);
    check_against<T>(from_storage(y), ref);
  }
  for (cpu::UnaryGrad op : {cpu::UnaryGrad::gelu_tanh, cpu::UnaryGrad::silu}) {
    cpu::unary_backward<H>(op, pos.data(), x.data(), ref.data(), n);
    cuda::unary_backward<T>(op, ps.data(), xs.data(), y.data(), n, nullptr);
    check_against<T>(from_storage(y), ref);
  }

  struct BinaryCase {
    std::vector<int64_t> a, b, out;
  };
  for (const BinaryCase& c : {BinaryCase{{2, 5, 6}, {6}, {2, 5, 6}}, BinaryCase{{2, 1, 5, 3}, {4, 1, 3}, {2, 4, 5, 3}},
                              BinaryCase{{2, 5, 6}, {2, 5, 6}, {2, 5, 6}}, BinaryCase{{2, 5, 1}, {5, 6}, {2, 5, 6}}}) {
    const auto a = values<T>(naive::random_normal(numel(c.a), 2102));
    const auto b = values<T>(naive::random_uniform(numel(c.b), 2103, 0.5, 2));
    const auto as = to_storage<T>(a), bs = to_storage<T>(b);
    const auto sa = broadcast_strides(c.a, c.out), sb = broadcast_strides(c.b, c.out);
    std::vector<H> r(static_cast<size_t>(numel(c.out)));
    std::vector<T> o(r.size());
    for (cpu::Binary op :
         {cpu::Binary::add, cpu::Binary::sub, cpu::Binary::mul, cpu::Binary::div, cpu::Binary::max, cpu::Binary::min}) {
      INFO("binary " << int(op) << " rank " << c.out.size());
      cpu::binary<H>(op, int(c.out.size()), c.out.data(), a.data(), sa.data(), b.data(), sb.data(), r.data());
      cuda::binary<T>(op, int(c.out.size()), c.out.data(), as.data(), sa.data(), bs.data(), sb.data(), o.data(),
                      nullptr);
      check_against<T>(from_storage(o), r);
    }
  }

  {  // permute {3, 0, 2, 1} of [2, 5, 3, 4], and a slice
    const std::vector<int64_t> shape{4, 2, 3, 5}, strides{1, 60, 4, 12};
    std::vector<H> r(120);
    std::vector<T> o(120);
    cpu::copy_strided<H>(4, shape.data(), x.data(), strides.data(), r.data());
    cuda::copy_strided<T>(4, shape.data(), xs.data(), strides.data(), o.data(), nullptr);
    check_identical(from_storage(o), r);
    const std::vector<int64_t> sshape{2, 3, 6}, sstrides{30, 6, 1};
    std::vector<H> r2(36);
    std::vector<T> o2(36);
    cpu::copy_strided<H>(3, sshape.data(), x.data() + 12, sstrides.data(), r2.data());
    cuda::copy_strided<T>(3, sshape.data(), xs.data() + 12, sstrides.data(), o2.data(), nullptr);
    check_identical(from_storage(o2), r2);
  }

  struct SumCase {
    std::vector<int64_t> x, out;
  };
  for (const SumCase& c :
       {SumCase{{2, 5, 6}, {1, 1, 6}}, SumCase{{2, 5, 6}, {2, 1, 1}}, SumCase{{2, 5, 6}, {1, 5, 1}},
        SumCase{{2, 5, 6}, {1, 1, 1}}, SumCase{{2, 5, 6}, {2, 5, 6}}, SumCase{{2, 3, 4, 5}, {1, 3, 1, 5}},
        SumCase{{300, 40}, {1, 40}}, SumCase{{6, 3000}, {6, 1}}, SumCase{{0, 7}, {1, 7}}}) {
    INFO("sum_to numel " << numel(c.x) << " → " << numel(c.out));
    const auto v = values<T>(naive::random_normal(numel(c.x), 2104));
    const auto vs = to_storage<T>(v);
    std::vector<H> r(static_cast<size_t>(numel(c.out)));
    std::vector<T> o(r.size());
    cpu::sum_to<H>(v.data(), int(c.x.size()), c.x.data(), c.out.data(), r.data());
    cuda::sum_to<T>(vs.data(), int(c.x.size()), c.x.data(), c.out.data(), o.data(), nullptr);
    check_against<T>(from_storage(o), r);
  }

  const auto big = values<T>(naive::random_normal(300000, 2105));
  const auto bigs = to_storage<T>(big);
  double ss = -1;
  cuda::sum_squares<T>(bigs.data(), int64_t(bigs.size()), &ss, nullptr);
  const double rss = cpu::sum_squares<H>(big.data(), int64_t(big.size()));
  CHECK(std::abs(ss - rss) <= 1e-12 * rss);
}

// The fused bias + tanh-GELU and its backward against the CPU kernels.
TEMPLATE_TEST_CASE("emulated fused bias + GELU matches the CPU", "[cuda-emulation][elementwise][fuse]", float, double,
                   cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  for (const auto& [rows, C] : {std::pair<int64_t, int64_t>{7, 37}, {300, 4}, {1, 1}}) {
    INFO("rows " << rows << " C " << C);
    const size_t n = static_cast<size_t>(rows * C);
    const auto x = values<T>(naive::random_normal(int64_t(n), 2200, 2.0)), dy = values<T>(naive::random_normal(int64_t(n), 2201));
    const auto b = values<T>(naive::random_normal(C, 2202));
    const auto xs = to_storage<T>(x), dys = to_storage<T>(dy), bs = to_storage<T>(b);
    std::vector<T> y(n);
    std::vector<H> ref(n);
    cpu::bias_gelu_tanh<H>(x.data(), b.data(), ref.data(), rows, C);
    cuda::bias_gelu_tanh<T>(xs.data(), bs.data(), y.data(), rows, C, nullptr);
    check_against<T>(from_storage(y), ref);
    cpu::bias_gelu_tanh_backward<H>(dy.data(), x.data(), b.data(), ref.data(), rows, C);
    cuda::bias_gelu_tanh_backward<T>(dys.data(), xs.data(), bs.data(), y.data(), rows, C, nullptr);
    check_against<T>(from_storage(y), ref);
  }
}

TEMPLATE_TEST_CASE("emulated fused SwiGLU matches the CPU", "[cuda-emulation][elementwise][fuse]", float, double,
                   cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{1500}}) {
    INFO("n " << n);
    const size_t m = static_cast<size_t>(n);
    auto gv = naive::random_normal(n, 2300, 3.0);
    if (n > 2) gv[0] = 95.0, gv[1] = -95.0;  // saturated sigmoid
    const auto g = values<T>(gv), u = values<T>(naive::random_normal(n, 2301));
    const auto dy = values<T>(naive::random_normal(n, 2302));
    const auto gs = to_storage<T>(g), us = to_storage<T>(u), dys = to_storage<T>(dy);
    std::vector<T> y(m), y2(m);
    std::vector<H> ref(m), ref2(m);
    cpu::swiglu<H>(g.data(), u.data(), ref.data(), n);
    cuda::swiglu<T>(gs.data(), us.data(), y.data(), n, nullptr);
    check_against<T>(from_storage(y), ref);
    cpu::swiglu_backward<H>(dy.data(), g.data(), u.data(), ref.data(), ref2.data(), n);
    cuda::swiglu_backward<T>(dys.data(), gs.data(), us.data(), y.data(), y2.data(), n, nullptr);
    check_against<T>(from_storage(y), ref);
    check_against<T>(from_storage(y2), ref2);
  }
}

// GPT-2's qkv into heads (qkv_heads) and back with the bias gradient (qkv_heads_backward).
TEMPLATE_TEST_CASE("emulated qkv_heads and its backward match the CPU", "[cuda-emulation][elementwise][fuse]", float,
                   double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  const int64_t B = 2, S = 5, N = 3, D = 4, W = 3 * N * D, n = B * S * W, m = n / 3;
  const auto x = values<T>(naive::random_normal(n, 2400)), b = values<T>(naive::random_normal(W, 2401));
  const auto dq = values<T>(naive::random_normal(m, 2402)), dk = values<T>(naive::random_normal(m, 2403));
  const auto dv = values<T>(naive::random_normal(m, 2404));
  const auto xs = to_storage<T>(x), bs = to_storage<T>(b);
  const auto dqs = to_storage<T>(dq), dks = to_storage<T>(dk), dvs = to_storage<T>(dv);
  const size_t heads = static_cast<size_t>(m), rows = static_cast<size_t>(n), width = static_cast<size_t>(W);
  std::vector<H> rq(heads), rk(heads), rv(heads), rdx(rows), rdb(width);
  std::vector<T> q(heads), k(heads), v(heads), dx(rows), db(width);
  cpu::qkv_heads<H>(x.data(), b.data(), rq.data(), rk.data(), rv.data(), B, S, N, D);
  cuda::qkv_heads<T>(xs.data(), bs.data(), q.data(), k.data(), v.data(), B, S, N, D, nullptr);
  check_against<T>(from_storage(q), rq);
  check_against<T>(from_storage(k), rk);
  check_against<T>(from_storage(v), rv);
  cpu::qkv_heads_backward<H>(dq.data(), dk.data(), dv.data(), rdx.data(), rdb.data(), B, S, N, D);
  cuda::qkv_heads_backward<T>(dqs.data(), dks.data(), dvs.data(), dx.data(), db.data(), B, S, N, D, nullptr);
  check_against<T>(from_storage(dx), rdx);
  check_against<T>(from_storage(db), rdb);
}

// Dropout (LoRA's lora_dropout): the CUDA kernel draws the CPU kernel's mask (kernels/kinds.h).
TEMPLATE_TEST_CASE("emulated dropout draws the CPU's mask", "[cuda-emulation][elementwise][dropout]", float, double,
                   cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  const int64_t rows = 33, C = 19;
  const size_t n = static_cast<size_t>(rows * C);
  const auto x = values<T>(naive::random_normal(int64_t(n), 2300, 2.0));
  const auto xs = to_storage<T>(x);
  std::vector<int64_t> token(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) token[size_t(r)] = 1000 + 37 * r;
  std::vector<T> y(n);
  std::vector<H> ref(n);
  for (double p : {0.0, 0.3, 0.75}) {
    INFO("p " << p);
    const uint64_t threshold = kernels::dropout_threshold(p);
    cpu::dropout<H>(x.data(), token.data(), ref.data(), rows, C, 99, threshold, 1.0 / (1.0 - p));
    cuda::dropout<T>(xs.data(), token.data(), y.data(), rows, C, 99, threshold, 1.0 / (1.0 - p), nullptr);
    check_against<T>(from_storage(y), ref);
  }
}
