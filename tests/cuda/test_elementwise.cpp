// CUDA elementwise launchers against the CPU kernels: unary maps and activation gradients,
// broadcasting binary ops (op-case shapes and larger, a transposed operand), strided copies,
// fill, casts (bitwise against the CPU conversions), sum_to (every kind of summed dims,
// deterministic) and sum_squares.
#include <cmath>
#include <limits>

#include "cuda/cuda_test.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.cuh"

namespace {

using namespace autosp;
using namespace autosp::cudatest;

const cpu::Unary kUnaryOps[] = {cpu::Unary::neg,  cpu::Unary::exp,   cpu::Unary::log,    cpu::Unary::tanh,
                                cpu::Unary::sqrt, cpu::Unary::rsqrt, cpu::Unary::square, cpu::Unary::gelu_tanh,
                                cpu::Unary::silu, cpu::Unary::scale, cpu::Unary::relu};

bool needs_positive(cpu::Unary op) {
  return op == cpu::Unary::log || op == cpu::Unary::sqrt || op == cpu::Unary::rsqrt;
}

struct BinaryCase {
  std::vector<int64_t> a, b, out;
};

const BinaryCase kBinaryCases[] = {
    {{2, 5, 6}, {6}, {2, 5, 6}},              // bias (op cases: add)
    {{2, 1, 5, 3}, {4, 1, 3}, {2, 4, 5, 3}},  // mid broadcast
    {{2, 5, 6}, {2, 5, 6}, {2, 5, 6}},        // same shape
    {{2, 5, 1}, {5, 6}, {2, 5, 6}},           // both broadcast
    {{2, 5, 6}, {2, 1, 1}, {2, 5, 6}},
    {{64, 33, 130}, {130}, {64, 33, 130}},  // larger
    {{300001}, {1}, {300001}},              // scalar operand
};

}  // namespace

TEMPLATE_TEST_CASE("cuda unary matches the CPU", "[cuda][elementwise]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  for (const int64_t n : {int64_t(1000), int64_t(100003)}) {
    for (cpu::Unary op : kUnaryOps) {
      INFO("op " << int(op) << " n " << n);
      const auto x =
          values<T>(needs_positive(op) ? naive::random_uniform(n, 11, 0.1, 3.0) : naive::random_normal(n, 12, 1.5));
      std::vector<H> ref(x.size());
      cpu::unary<H>(op, x.data(), ref.data(), n, -0.375);
      Dev<T> dx(x), dy(static_cast<size_t>(n));
      cuda::unary<T>(op, dx.get(), dy.get(), n, -0.375, nullptr);
      check_against<T>(dy.download(), ref);
      cuda::unary<T>(op, dx.get(), dx.get(), n, -0.375, nullptr);  // in place
      check_against<T>(dx.download(), ref);
    }
  }
}

TEMPLATE_TEST_CASE("cuda unary_backward matches the CPU", "[cuda][elementwise]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  const int64_t n = 50001;
  const auto x = values<T>(naive::random_normal(n, 21, 2.0)), dy = values<T>(naive::random_normal(n, 22));
  for (cpu::UnaryGrad op : {cpu::UnaryGrad::gelu_tanh, cpu::UnaryGrad::silu}) {
    std::vector<H> ref(x.size());
    cpu::unary_backward<H>(op, dy.data(), x.data(), ref.data(), n);
    Dev<T> ddy(dy), dx(x), ddx(static_cast<size_t>(n));
    cuda::unary_backward<T>(op, ddy.get(), dx.get(), ddx.get(), n, nullptr);
    check_against<T>(ddx.download(), ref);
  }
}

TEMPLATE_TEST_CASE("cuda binary broadcasts like the CPU", "[cuda][elementwise]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  uint32_t seed = 40;
  for (const BinaryCase& c : kBinaryCases) {
    const auto a = values<T>(naive::random_normal(numel(c.a), seed++));
    auto b = values<T>(naive::random_uniform(numel(c.b), seed++, 0.5, 2.0));  // away from 0 for div
    const auto sa = broadcast_strides(c.a, c.out), sb = broadcast_strides(c.b, c.out);
    const int rank = int(c.out.size());
    Dev<T> da(a), db(b), dout(size_t(numel(c.out)));
    for (cpu::Binary op :
         {cpu::Binary::add, cpu::Binary::sub, cpu::Binary::mul, cpu::Binary::div, cpu::Binary::max, cpu::Binary::min}) {
      INFO("op " << int(op) << " out rank " << rank << " numel " << numel(c.out));
      std::vector<H> ref(size_t(numel(c.out)));
      cpu::binary<H>(op, rank, c.out.data(), a.data(), sa.data(), b.data(), sb.data(), ref.data());
      cuda::binary<T>(op, rank, c.out.data(), da.get(), sa.data(), db.get(), sb.data(), dout.get(), nullptr);
      check_against<T>(dout.download(), ref);
    }
  }
  SECTION("a transposed operand and NaN propagation") {
    const std::vector<int64_t> out{37, 53};
    auto a = values<T>(naive::random_normal(37 * 53, 50));  // stored [53, 37], read transposed
    a[7] = std::numeric_limits<H>::quiet_NaN();
    const auto b = values<T>(naive::random_normal(37 * 53, 51));
    const std::vector<int64_t> sa{1, 37}, sb{53, 1};
    Dev<T> da(a), db(b), dout(size_t(37 * 53));
    for (cpu::Binary op : {cpu::Binary::add, cpu::Binary::max, cpu::Binary::min}) {
      std::vector<H> ref(size_t(37 * 53));
      cpu::binary<H>(op, 2, out.data(), a.data(), sa.data(), b.data(), sb.data(), ref.data());
      cuda::binary<T>(op, 2, out.data(), da.get(), sa.data(), db.get(), sb.data(), dout.get(), nullptr);
      const auto got = dout.download();
      std::vector<H> got_finite, ref_finite;  // NaN where the CPU has NaN, the CPU's values elsewhere
      for (size_t i = 0; i < ref.size(); ++i) {
        CHECK(std::isnan(got[i]) == std::isnan(ref[i]));
        if (std::isnan(ref[i])) continue;
        got_finite.push_back(got[i]);
        ref_finite.push_back(ref[i]);
      }
      check_against<T>(got_finite, ref_finite);
    }
  }
}

TEMPLATE_TEST_CASE("cuda copy_strided and fill are exact", "[cuda][elementwise]", float, double, cuda::bf16, int64_t,
                   int32_t, uint16_t) {
  using T = TestType;
  using H = Host<T>;
  struct CopyCase {
    std::vector<int64_t> shape, strides;
    int64_t offset, src_numel;
  };
  const CopyCase cases[] = {
      {{2, 4, 5, 3}, {60, 3, 12, 1}, 0, 120},  // transpose(1, 2) of [2, 5, 4, 3]
      {{4, 2, 3, 5}, {1, 60, 4, 12}, 0, 120},  // permute {3, 0, 2, 1} of [2, 5, 3, 4]
      {{2, 3, 6}, {30, 6, 1}, 12, 60},         // slice [2, 5) of dim 1 of [2, 5, 6]
      {{128, 96}, {1, 128}, 0, 128 * 96},      // a large transpose
      {{3, 1000}, {1000, 1}, 0, 3000},         // contiguous: a memcpy
  };
  uint32_t seed = 60;
  for (const CopyCase& c : cases) {
    const auto src = values<T>(naive::random_uniform(c.src_numel, seed++, 0, 100));  // ≥ 0: also unsigned T
    std::vector<H> ref(size_t(numel(c.shape)));
    cpu::copy_strided<H>(int(c.shape.size()), c.shape.data(), src.data() + c.offset, c.strides.data(), ref.data());
    Dev<T> dsrc(src), ddst(ref.size());
    cuda::copy_strided<T>(int(c.shape.size()), c.shape.data(), dsrc.get() + c.offset, c.strides.data(), ddst.get(),
                          nullptr);
    check_identical(ddst.download(), ref);
  }
  Dev<T> d(size_t(1001));
  T value;
  if constexpr (std::is_same_v<T, cuda::bf16>)
    value = bf16_from_bits(cpu::f32_to_bf16(-1.25f));
  else
    value = T(-5);
  cuda::fill<T>(d.get(), 1001, value, nullptr);
  const auto got = d.download();
  for (H v : got) CHECK(v == (std::is_same_v<T, cuda::bf16> ? H(-1.25) : H(-5)));
}

TEST_CASE("cuda casts round like the CPU conversions", "[cuda][elementwise]") {
  std::vector<float> x = {0.f,
                          -0.f,
                          1.f,
                          -1.5f,
                          3.14159265f,
                          1e-30f,
                          65504.f,
                          65520.f,
                          1e30f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          5.9604645e-08f,
                          2.9802322e-08f,
                          1.0009765625f,
                          1.00048828125f};
  const auto more = naive::random_normal(10000, 70, 100.0);
  x.insert(x.end(), more.begin(), more.end());
  const int64_t n = int64_t(x.size());
  Dev<float> dx(x);
  SECTION("float → bf16 → float") {
    Dev<cuda::bf16> dh(x.size());
    cuda::cast<float, cuda::bf16>(dx.get(), dh.get(), n, nullptr);
    std::vector<uint16_t> bits(x.size());
    CUDA_CHECK(cudaMemcpy(bits.data(), dh.get(), bits.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < x.size(); ++i) {
      INFO("x = " << x[i]);
      CHECK(bits[i] == cpu::f32_to_bf16(x[i]));
    }
    Dev<float> back(x.size());
    cuda::cast<cuda::bf16, float>(dh.get(), back.get(), n, nullptr);
    const auto got = back.download();
    for (size_t i = 0; i < x.size(); ++i) CHECK(got[i] == cpu::bf16_to_f32(bits[i]));
  }
  SECTION("float → f16 → float") {
    Dev<cuda::f16> dh(x.size());
    cuda::cast<float, cuda::f16>(dx.get(), dh.get(), n, nullptr);
    std::vector<uint16_t> bits(x.size());
    CUDA_CHECK(cudaMemcpy(bits.data(), dh.get(), bits.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < x.size(); ++i) {
      INFO("x = " << x[i]);
      CHECK(bits[i] == cpu::f32_to_f16(x[i]));
    }
    Dev<float> back(x.size());
    cuda::cast<cuda::f16, float>(dh.get(), back.get(), n, nullptr);
    const auto got = back.download();
    for (size_t i = 0; i < x.size(); ++i) CHECK(got[i] == cpu::f16_to_f32(bits[i]));
  }
  SECTION("float ↔ double, int32 ↔ int64") {
    Dev<double> dd(x.size());
    cuda::cast<float, double>(dx.get(), dd.get(), n, nullptr);
    const auto d = dd.download();
    for (size_t i = 0; i < x.size(); ++i) CHECK(d[i] == double(x[i]));
    Dev<float> df(x.size());
    cuda::cast<double, float>(dd.get(), df.get(), n, nullptr);
    check_identical(df.download(), x);
    const std::vector<int64_t> ids = {0, 1, -100, 50256, 2147483647, -2147483648LL};
    Dev<int64_t> di(ids);
    Dev<int32_t> d32(ids.size());
    cuda::cast<int64_t, int32_t>(di.get(), d32.get(), int64_t(ids.size()), nullptr);
    Dev<int64_t> d64(ids.size());
    cuda::cast<int32_t, int64_t>(d32.get(), d64.get(), int64_t(ids.size()), nullptr);
    check_identical(d64.download(), ids);
  }
}

TEMPLATE_TEST_CASE("cuda sum_to matches the CPU and is deterministic", "[cuda][elementwise]", float, double,
                   cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  struct SumCase {
    std::vector<int64_t> x, out;
  };
  const SumCase cases[] = {
      {{2, 5, 6}, {1, 1, 6}},        // bias gradient (op cases)
      {{2, 5, 6}, {2, 1, 1}},        // inner summed
      {{2, 5, 6}, {1, 5, 1}},        // outer and inner summed
      {{2, 5, 6}, {1, 1, 1}},        // everything
      {{2, 5, 6}, {2, 5, 6}},        // nothing: a copy
      {{2, 3, 4, 5}, {1, 3, 1, 5}},  // alternating
      {{4096, 768}, {1, 768}},       // a bias over many rows
      {{64, 4096}, {64, 1}},         // long rows
      {{3, 70001}, {3, 1}},          // very long rows
      {{8, 300, 9}, {8, 1, 9}},      // middle summed, inner kept
      {{200003}, {1}},               // rank 1, everything
      {{0, 7}, {1, 7}},              // empty: zeros
  };
  uint32_t seed = 80;
  for (const SumCase& c : cases) {
    INFO("x numel " << numel(c.x) << " out numel " << numel(c.out) << " rank " << c.x.size());
    const auto x = values<T>(naive::random_normal(numel(c.x), seed++));
    std::vector<H> ref(size_t(numel(c.out)));
    cpu::sum_to<H>(x.data(), int(c.x.size()), c.x.data(), c.out.data(), ref.data());
    std::vector<H> magnitude(ref.size());
    const auto abs_x = absolute(x);
    cpu::sum_to<H>(abs_x.data(), int(c.x.size()), c.x.data(), c.out.data(), magnitude.data());
    Dev<T> dx(x), d1(ref.size()), d2(ref.size());
    cuda::sum_to<T>(dx.get(), int(c.x.size()), c.x.data(), c.out.data(), d1.get(), nullptr);
    cuda::sum_to<T>(dx.get(), int(c.x.size()), c.x.data(), c.out.data(), d2.get(), nullptr);
    const auto got = d1.download();
    check_sum_against<T>(got, ref, magnitude);
    check_identical(got, d2.download());
  }
}

TEMPLATE_TEST_CASE("cuda sum_squares matches the CPU", "[cuda][elementwise]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  for (const int64_t n : {int64_t(0), int64_t(17), int64_t(1000003)}) {
    const auto x = values<T>(naive::random_normal(n, 90));
    const double ref = cpu::sum_squares<H>(x.data(), n);
    Dev<T> dx(x);
    Dev<double> out(1);
    cuda::sum_squares<T>(dx.get(), n, out.get(), nullptr);
    const double got = out.download()[0];
    INFO("n " << n << " got " << got << " ref " << ref);
    CHECK(std::abs(got - ref) <= 1e-12 * (1 + std::abs(ref)));
  }
}
