// CPU elementwise kernels against naive references: every unary op, broadcasting binary ops over a
// table of shape pairs (bias, middle-dim rank-4, outer product, scalar, rank 8, empty), strided
// reads (transpose, slice, permute) for every storage type, fill, and the bf16 / f16 conversions
// on known bit patterns plus nearest-even properties over many values. Backward: unary_backward
// and sum_to (a table of patterns: no-op, leading, trailing, middle, alternating rank 4, rank 8,
// empty) against naive references and central differences of the forward ops; the reductions
// bitwise across thread counts.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/elementwise.h"

namespace {

using namespace autosp;
using cpu::Binary;
using cpu::Unary;
using naive::Shape;

// Strides that read a tensor of `shape` (contiguous) at every index of `out` (NumPy broadcasting:
// right-aligned, stride 0 on a dim of size 1 or a missing leading dim).
std::vector<int64_t> broadcast_strides(const Shape& shape, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i + out.size() - shape.size()] = shape[i] == 1 ? 0 : step;
    step *= shape[i];
  }
  return strides;
}

struct UnaryCase {
  Unary op;
  const char* name;
  double (*ref)(double);
  bool positive;  // domain needs x > 0
};

const UnaryCase kUnaryCases[] = {
    {Unary::neg, "neg", [](double x) { return -x; }, false},
    {Unary::exp, "exp", [](double x) { return std::exp(x); }, false},
    {Unary::log, "log", [](double x) { return std::log(x); }, true},
    {Unary::tanh, "tanh", [](double x) { return std::tanh(x); }, false},
    {Unary::sqrt, "sqrt", [](double x) { return std::sqrt(x); }, true},
    {Unary::rsqrt, "rsqrt", naive::rsqrt, true},
    {Unary::square, "square", [](double x) { return x * x; }, false},
    {Unary::gelu_tanh, "gelu_tanh", naive::gelu_tanh, false},
    {Unary::silu, "silu", naive::silu, false},
    {Unary::scale, "scale", [](double x) { return -0.375 * x; }, false},
    {Unary::relu, "relu", naive::relu, false},
};

struct BinaryCase {
  Binary op;
  const char* name;
  double (*ref)(double, double);
};

const BinaryCase kBinaryOps[] = {
    {Binary::add, "add", [](double a, double b) { return a + b; }},
    {Binary::sub, "sub", [](double a, double b) { return a - b; }},
    {Binary::mul, "mul", [](double a, double b) { return a * b; }},
    {Binary::div, "div", [](double a, double b) { return a / b; }},
    {Binary::max, "max", [](double a, double b) { return a > b ? a : b; }},
    {Binary::min, "min", [](double a, double b) { return a < b ? a : b; }},
};

struct ShapePair {
  Shape a, b;
};

const ShapePair kBroadcastShapes[] = {
    {{7}, {7}},
    {{65, 130}, {65, 130}},
    {{64, 1024}, {64, 1024}},        // contiguous, split across threads
    {{4, 65, 130}, {130}},           // bias
    {{64, 600}, {600}},              // bias, split across threads
    {{2, 8, 65, 16}, {1, 8, 1, 16}}, // rank 4, broadcast on middle dims
    {{2, 8, 7, 16}, {2, 1, 7, 1}},
    {{4, 8, 64, 32}, {1, 8, 1, 32}}, // rank 4, split across threads
    {{2, 3, 5, 7}, {3, 1, 1}},
    {{1, 130}, {65, 130}},           // a broadcast
    {{65, 1}, {1, 130}},             // outer product
    {{}, {5, 7}},                    // scalar a
    {{5, 7}, {}},                    // scalar b
    {{2, 1, 3, 1, 2, 3, 1, 2}, {1, 2, 1, 3, 2, 1, 2, 2}},  // rank 8
    {{0, 5}, {5}},                   // empty
};

}  // namespace

TEMPLATE_TEST_CASE("unary ops match the naive maps", "[kernels][elementwise]", float, double) {
  using T = TestType;
  for (const int64_t n : {1, 1000, 70000}) {
    for (const UnaryCase& u : kUnaryCases) {
      INFO("op " << u.name << " n " << n);
      const auto x = test::cast<T>(u.positive ? naive::random_uniform(n, 7, 0.05, 4.0)
                                              : naive::random_normal(n, 7, 2.0));
      std::vector<T> y(x.size(), T(0));
      cpu::unary<T>(u.op, x.data(), y.data(), n, -0.375);
      test::check_close(y, naive::map(test::widen(x), u.ref));
      std::vector<T> z = x;  // in place
      cpu::unary<T>(u.op, z.data(), z.data(), n, -0.375);
      CHECK(z == y);
    }
  }
}

TEMPLATE_TEST_CASE("binary ops broadcast like NumPy", "[kernels][elementwise]", float, double) {
  using T = TestType;
  uint32_t seed = 1;
  for (const ShapePair& sp : kBroadcastShapes) {
    const Shape out_shape = naive::broadcast_shape(sp.a, sp.b);
    const auto a = test::cast<T>(naive::random_normal(naive::numel(sp.a), seed++));
    const auto b = test::cast<T>(naive::random_uniform(naive::numel(sp.b), seed++, 0.5, 2.0));
    const auto sa = broadcast_strides(sp.a, out_shape), sb = broadcast_strides(sp.b, out_shape);
    for (const BinaryCase& op : kBinaryOps) {
      INFO("op " << op.name << " a " << Catch::Detail::stringify(sp.a) << " b "
                 << Catch::Detail::stringify(sp.b));
      std::vector<T> out(static_cast<size_t>(naive::numel(out_shape)), T(-777));
      cpu::binary<T>(op.op, int(out_shape.size()), out_shape.data(), a.data(), sa.data(), b.data(),
                     sb.data(), out.data());
      test::check_close(
          out, naive::broadcast_binary(test::widen(a), sp.a, test::widen(b), sp.b, op.ref));
    }
  }
}

TEMPLATE_TEST_CASE("binary reads a transposed operand through strides", "[kernels][elementwise]",
                   float, double) {
  using T = TestType;
  const int64_t R = 33, C = 70;
  const auto at = test::cast<T>(naive::random_normal(C * R, 11));  // stored [C, R]
  const auto b = test::cast<T>(naive::random_normal(C, 12));       // [C]
  const Shape out_shape = {R, C};
  const int64_t sa[] = {1, R}, sb[] = {0, 1};
  std::vector<T> out(static_cast<size_t>(R * C));
  cpu::binary<T>(Binary::sub, 2, out_shape.data(), at.data(), sa, b.data(), sb, out.data());
  const naive::Vec a = naive::permute(test::widen(at), {C, R}, {1, 0});
  test::check_close(out, naive::broadcast_binary(a, {R, C}, test::widen(b), {C},
                                                 [](double x, double y) { return x - y; }));
}

TEMPLATE_TEST_CASE("copy_strided permutes and slices", "[kernels][elementwise]", float, double,
                   int32_t, int64_t, uint16_t) {
  using T = TestType;
  auto iota = [](int64_t n) {
    std::vector<T> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = T(i % 65521);
    return v;
  };
  SECTION("permutations") {
    struct PermCase {
      Shape shape;
      std::vector<int> perm;
    };
    const PermCase cases[] = {
        {{4, 5, 6}, {2, 0, 1}},     {{4, 5, 6}, {0, 2, 1}},      {{2, 3, 4, 5}, {0, 2, 1, 3}},
        {{2, 3, 4, 5}, {3, 2, 1, 0}}, {{1, 7, 1, 9}, {3, 1, 2, 0}}, {{300, 257}, {1, 0}},
        {{5}, {0}},
    };
    for (const PermCase& pc : cases) {
      INFO("shape " << Catch::Detail::stringify(pc.shape) << " perm "
                    << Catch::Detail::stringify(pc.perm));
      const int r = int(pc.shape.size());
      const auto src = iota(naive::numel(pc.shape));
      std::vector<int64_t> in_strides(static_cast<size_t>(r)), out_shape(static_cast<size_t>(r)), src_strides(static_cast<size_t>(r));
      for (int d = r - 1, step = 1; d >= 0; --d) {
        in_strides[size_t(d)] = step;
        step *= int(pc.shape[size_t(d)]);
      }
      for (int d = 0; d < r; ++d) {
        out_shape[size_t(d)] = pc.shape[size_t(pc.perm[size_t(d)])];
        src_strides[size_t(d)] = in_strides[size_t(pc.perm[size_t(d)])];
      }
      std::vector<T> dst(src.size(), T(0));
      cpu::copy_strided<T>(r, out_shape.data(), src.data(), src_strides.data(), dst.data());
      const naive::Vec ref = naive::permute(test::widen(src), pc.shape, pc.perm);
      CHECK(test::widen(dst) == ref);
    }
  }
  SECTION("slice with a step") {
    const auto base = iota(10 * 12);                  // [10, 12]
    const int64_t shape[] = {5, 4}, strides[] = {12, 2};  // rows 2..6, cols 3, 5, 7, 9
    std::vector<T> dst(20, T(0));
    cpu::copy_strided<T>(2, shape, base.data() + 2 * 12 + 3, strides, dst.data());
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 4; ++j) CHECK(dst[size_t(i * 4 + j)] == T((2 + i) * 12 + 3 + 2 * j));
  }
  SECTION("rank 0 and broadcast reads") {
    const std::vector<T> one = {T(42)};
    std::vector<T> dst(1, T(0));
    cpu::copy_strided<T>(0, nullptr, one.data(), nullptr, dst.data());
    CHECK(dst[0] == T(42));
    const int64_t shape[] = {3, 4}, strides[] = {1, 0};  // expand [3] to [3, 4]
    const std::vector<T> col = {T(1), T(2), T(3)};
    std::vector<T> wide(12, T(0));
    cpu::copy_strided<T>(2, shape, col.data(), strides, wide.data());
    for (int64_t i = 0; i < 12; ++i) CHECK(wide[size_t(i)] == T(1 + i / 4));
  }
}

TEMPLATE_TEST_CASE("fill writes every element", "[kernels][elementwise]", float, double, int32_t,
                   int64_t, uint16_t) {
  using T = TestType;
  for (const int64_t n : {0, 3, 100001}) {
    std::vector<T> x(static_cast<size_t>(n) + 1, T(9));
    cpu::fill<T>(x.data(), n, T(5));
    for (int64_t i = 0; i < n; ++i) REQUIRE(x[size_t(i)] == T(5));
    CHECK(x[size_t(n)] == T(9));  // no write past n
  }
}

namespace {

float bits_f(uint32_t u) { return std::bit_cast<float>(u); }

// Independent decoders: the value of a bf16 / f16 pattern as a double, from the format definition.
double bf16_value(uint16_t h) { return double(bits_f(uint32_t(h) << 16)); }
double f16_value(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(double(m), -24);
  return sign * std::ldexp(double(1024 + m), e - 25);
}

// h is the nearest pattern to f (ties to an even mantissa) among its neighbours h ± 1.
bool is_nearest_even(float f, uint16_t h, double (*value)(uint16_t)) {
  const double x = double(f);
  double v = value(h);
  if (std::isinf(v)) {  // inf rounds like the value one ulp past the largest finite one
    const double max = value(uint16_t(h - 1));
    v = max + (max - value(uint16_t(h - 2)));
  }
  for (int delta : {-1, 1}) {
    const uint16_t n = uint16_t(h + delta);
    if ((n & 0x7fff) == 0x7fff || ((n ^ h) & 0x8000)) continue;  // stepped off the sign's range
    const double w = value(n);
    if (std::isnan(w)) continue;
    const double dv = std::abs(x - v), dw = std::abs(x - w);
    if (dw < dv) return false;
    if (dw == dv && (h & 1)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("bf16 conversion on known bit patterns", "[kernels][elementwise][convert]") {
  using cpu::f32_to_bf16;
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(f32_to_bf16(-2.0f) == 0xC000);
  CHECK(f32_to_bf16(0.0f) == 0x0000);
  CHECK(f32_to_bf16(-0.0f) == 0x8000);
  CHECK(f32_to_bf16(bits_f(0x3F808000)) == 0x3F80);  // tie, even stays
  CHECK(f32_to_bf16(bits_f(0x3F818000)) == 0x3F82);  // tie, odd rounds up
  CHECK(f32_to_bf16(bits_f(0x3F808001)) == 0x3F81);
  CHECK(f32_to_bf16(bits_f(0x3F807FFF)) == 0x3F80);
  CHECK(f32_to_bf16(INFINITY) == 0x7F80);
  CHECK(f32_to_bf16(-INFINITY) == 0xFF80);
  CHECK(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds up to inf
  CHECK(f32_to_bf16(bits_f(0x00000001)) == 0x0000);                 // smallest subnormal
  CHECK(f32_to_bf16(bits_f(0x00018000)) == 0x0002);                 // subnormal tie to even
  const uint16_t nan = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  CHECK(((nan & 0x7F80) == 0x7F80 && (nan & 0x7F) != 0));
  const uint16_t low_nan = f32_to_bf16(bits_f(0x7F800001));  // payload only in dropped bits
  CHECK(((low_nan & 0x7F80) == 0x7F80 && (low_nan & 0x7F) != 0));
  CHECK(cpu::bf16_to_f32(0x3F80) == 1.0f);
  CHECK(cpu::bf16_to_f32(0xC000) == -2.0f);
  CHECK(std::isinf(cpu::bf16_to_f32(0x7F80)));
  CHECK(std::isnan(cpu::bf16_to_f32(0x7FC0)));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every pattern round-trips
    const float f = cpu::bf16_to_f32(uint16_t(h));
    if (std::isnan(bf16_value(uint16_t(h)))) {
      REQUIRE(std::isnan(f));
      continue;
    }
    REQUIRE(double(f) == bf16_value(uint16_t(h)));
    REQUIRE(f32_to_bf16(f) == h);
  }
}

TEST_CASE("f16 conversion on known bit patterns", "[kernels][elementwise][convert]") {
  using cpu::f32_to_f16;
  CHECK(f32_to_f16(1.0f) == 0x3C00);
  CHECK(f32_to_f16(-2.0f) == 0xC000);
  CHECK(f32_to_f16(0.0f) == 0x0000);
  CHECK(f32_to_f16(-0.0f) == 0x8000);
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);                      // largest finite
  CHECK(f32_to_f16(std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
  CHECK(f32_to_f16(65520.0f) == 0x7C00);                      // tie rounds to even: inf
  CHECK(f32_to_f16(1e6f) == 0x7C00);
  CHECK(f32_to_f16(-1e6f) == 0xFC00);
  CHECK(f32_to_f16(INFINITY) == 0x7C00);
  CHECK(f32_to_f16(-INFINITY) == 0xFC00);
  CHECK(f32_to_f16(1.0f + 0x1p-11f) == 0x3C00);  // tie, even stays
  CHECK(f32_to_f16(1.0f + 0x3p-11f) == 0x3C02);  // tie, odd rounds up
  CHECK(f32_to_f16(0x1p-14f) == 0x0400);         // smallest normal
  CHECK(f32_to_f16(0x1p-24f) == 0x0001);         // smallest subnormal
  CHECK(f32_to_f16(0x1p-25f) == 0x0000);         // tie to even zero
  CHECK(f32_to_f16(0x1.8p-25f) == 0x0001);
  CHECK(f32_to_f16(0x3p-25f) == 0x0002);         // 1.5 units: tie to even 2
  CHECK(f32_to_f16(0x5p-25f) == 0x0002);         // 2.5 units: tie to even 2
  CHECK(f32_to_f16(-0x1p-24f) == 0x8001);
  CHECK(f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400);  // 1023.5 units: tie to even 1024 = normal
  CHECK(f32_to_f16(1e-10f) == 0x0000);
  CHECK(f32_to_f16(bits_f(0x00000001)) == 0x0000);
  const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  CHECK(((nan & 0x7C00) == 0x7C00 && (nan & 0x3FF) != 0));
  const uint16_t low_nan = f32_to_f16(bits_f(0xFF800001));
  CHECK(((low_nan & 0x7C00) == 0x7C00 && (low_nan & 0x3FF) != 0));
  CHECK(cpu::f16_to_f32(0x3C00) == 1.0f);
  CHECK(cpu::f16_to_f32(0x0001) == 0x1p-24f);
  CHECK(cpu::f16_to_f32(0x83FF) == -0x3FFp-24f);
  CHECK(std::isnan(cpu::f16_to_f32(0x7E00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every pattern decodes exactly and round-trips
    const float f = cpu::f16_to_f32(uint16_t(h));
    const double ref = f16_value(uint16_t(h));
    if (std::isnan(ref)) {
      REQUIRE(std::isnan(f));
      continue;
    }
    REQUIRE(double(f) == ref);
    REQUIRE(f32_to_f16(f) == h);
  }
}

TEST_CASE("f32 to bf16 / f16 rounds to the nearest, ties to even", "[kernels][elementwise][convert]") {
  std::mt19937 gen(5);
  for (int i = 0; i < 200000; ++i) {
    // Random sign and mantissa; exponents spanning f16's subnormals to its overflow.
    const uint32_t e = 127 - 26 + gen() % 43;
    const uint32_t u = (gen() & 0x80000000u) | (e << 23) | (gen() & 0x7fffffu);
    const float f = bits_f(u);
    INFO("f32 bits " << std::hex << u);
    REQUIRE(is_nearest_even(f, cpu::f32_to_f16(f), f16_value));
    REQUIRE(is_nearest_even(f, cpu::f32_to_bf16(f), bf16_value));
    // Exact ties: the low half of the dropped bits is exactly one half.
    const float tie = bits_f((u & ~0xffffu) | 0x8000u);
    REQUIRE(is_nearest_even(tie, cpu::f32_to_bf16(tie), bf16_value));
  }
}

// ---- backward and reductions -------------------------------------------------------------------

namespace {

struct UnaryGradCase {
  cpu::UnaryGrad grad;
  Unary forward;
  const char* name;
  double (*ref)(double);
};
const UnaryGradCase kUnaryGradCases[] = {
    {cpu::UnaryGrad::gelu_tanh, Unary::gelu_tanh, "gelu_tanh", naive::gelu_tanh_grad},
    {cpu::UnaryGrad::silu, Unary::silu, "silu", naive::silu_grad},
};

struct SumToCase {
  Shape x, out;
};
const SumToCase kSumToCases[] = {
    {{}, {}},                                                  // rank 0
    {{7}, {7}},                                                // no-op: a copy
    {{65, 130}, {65, 130}},
    {{7}, {1}},                                                // everything
    {{100003}, {1}},                                           // everything, chunked
    {{65, 130}, {1, 130}},                                     // bias: leading dims
    {{4, 33, 130}, {1, 1, 130}},
    {{4096, 33}, {1, 33}},                                     // many rows, chunked
    {{300, 3000}, {1, 3000}},                                  // chunks × column blocks
    {{1000, 203}, {1, 203}},                                   // chunks; columns by 64, 8 and one
    {{3, 100000}, {1, 100000}},                                // column blocks only
    {{65, 130}, {65, 1}},                                      // trailing dim
    {{2000, 70}, {2000, 1}},
    {{3, 5, 7}, {3, 1, 7}},                                    // a middle dim
    {{4, 512, 33}, {4, 1, 33}},
    {{3, 5, 7}, {1, 5, 1}},                                    // leading and trailing
    {{8, 300, 40}, {1, 300, 1}},
    {{2, 3, 4, 5}, {1, 3, 1, 5}},                              // rank 4, alternating
    {{2, 3, 4, 5}, {2, 1, 4, 1}},
    {{2, 3, 4, 5}, {1, 1, 1, 1}},
    {{6, 1, 5, 9}, {1, 1, 5, 1}},                              // a size-1 dim in x
    {{2, 1, 3, 2, 1, 2, 3, 2}, {1, 1, 3, 1, 1, 2, 1, 2}},      // rank 8
    {{0, 3}, {1, 3}},                                          // empty x: zeros
};

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

TEMPLATE_TEST_CASE("unary_backward matches the naive derivatives", "[kernels][elementwise][backward]", float,
                   double) {
  using T = TestType;
  for (const UnaryGradCase& c : kUnaryGradCases) {
    for (const int64_t n : {int64_t(1), int64_t(1000), int64_t(70001)}) {
      INFO(c.name << " n " << n);
      naive::Vec xs = naive::random_normal(n, 1200 + uint32_t(n), 3.0);
      if (n >= 4) xs[0] = 40.0, xs[1] = -40.0, xs[2] = 12.0, xs[3] = -12.0;  // saturated: no NaN
      const auto x = test::cast<T>(xs);
      const auto dy = test::cast<T>(naive::random_normal(n, 1300 + uint32_t(n)));
      std::vector<T> dx(x.size(), T(-777));
      cpu::unary_backward<T>(c.grad, dy.data(), x.data(), dx.data(), n);
      const naive::Vec xw = test::widen(x), dyw = test::widen(dy);
      naive::Vec ref(xw.size());
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = dyw[i] * c.ref(xw[i]);
      test::check_close(dx, ref);
    }
  }
}

TEST_CASE("unary_backward agrees with central differences of unary", "[kernels][elementwise][backward]") {
  for (const UnaryGradCase& c : kUnaryGradCases) {
    INFO(c.name);
    const int64_t n = 777;
    naive::Vec x = naive::random_normal(n, 1400, 2.0);
    const naive::Vec dy = naive::random_normal(n, 1401), u = naive::random_normal(n, 1402);
    std::vector<double> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n));
    cpu::unary_backward<double>(c.grad, dy.data(), x.data(), dx.data(), n);
    test::check_directional(x, u, dx, [&] {
      cpu::unary<double>(c.forward, x.data(), y.data(), n, 0.0);
      return test::dot(y, dy);
    });
  }
}

TEMPLATE_TEST_CASE("bias_gelu_tanh and its backward match the naive gelu of x + b", "[kernels][elementwise][backward]",
                   float, double) {
  using T = TestType;
  // C = 6 and 33 end in a partial vector of 16 lanes; 1024 × 64 is split across threads.
  for (const auto& [rows, C] : {std::pair<int64_t, int64_t>{3, 6}, {5, 16}, {7, 33}, {64, 1024}}) {
    INFO("rows " << rows << " C " << C);
    naive::Vec xs = naive::random_normal(rows * C, 1400 + uint32_t(C), 3.0);
    xs[0] = 40.0, xs[1] = -40.0, xs[2] = 12.0, xs[3] = -12.0;  // saturated: no NaN
    const auto x = test::cast<T>(xs), b = test::cast<T>(naive::random_normal(C, 1500, 0.5));
    const auto dy = test::cast<T>(naive::random_normal(rows * C, 1600));
    std::vector<T> y(x.size(), T(-777)), dx(x.size(), T(-777));
    cpu::bias_gelu_tanh<T>(x.data(), b.data(), y.data(), rows, C);
    cpu::bias_gelu_tanh_backward<T>(dy.data(), x.data(), b.data(), dx.data(), rows, C);
    naive::Vec ref(xs.size()), dref(xs.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const double v = double(T(x[r * C + c] + b[c]));  // the sum the kernel sees, rounded to T
        ref[r * C + c] = naive::gelu_tanh(v);
        dref[r * C + c] = double(dy[r * C + c]) * naive::gelu_tanh_grad(v);
      }
    test::check_close(y, ref);
    test::check_close(dx, dref);
  }
}

// GPT-2's qkv_heads backward: dx [B, S, 3, N, D] laid back from dq, dk, dv [B, N, S, D], and the
// bias gradient db = dx summed over B and S, against float64 loops; db is also sum_to's over dx
// (the same chunks, the same bits) at any thread count. The sizes make row chunks that cross a
// sequence's end, column blocks that cut a head's run (3·N·D = 1440 > 1024), and runs of D = 83
// and 40 that end in blocks of 8 and single columns.
TEMPLATE_TEST_CASE("qkv_heads_backward lays the heads back and sums the bias", "[kernels][elementwise][backward]",
                   float, double) {
  using T = TestType;
  struct Dims {
    int64_t B, S, N, D;
  };
  uint32_t seed = 1800;
  for (const Dims& z : {Dims{2, 5, 3, 4}, Dims{3, 200, 4, 24}, Dims{2, 300, 12, 40}, Dims{2, 100, 2, 83}}) {
    INFO("B " << z.B << " S " << z.S << " N " << z.N << " D " << z.D);
    const int64_t C = z.N * z.D, W = 3 * C, m = z.B * z.S * C;
    std::vector<T> in[3];
    for (auto& h : in) h = test::cast<T>(naive::random_normal(m, seed++));
    naive::Vec ref(size_t(z.B * z.S * W)), dref(size_t(W), 0.0);
    for (int64_t b = 0; b < z.B; ++b)
      for (int64_t s = 0; s < z.S; ++s)
        for (int64_t p = 0; p < 3; ++p)
          for (int64_t n = 0; n < z.N; ++n)
            for (int64_t d = 0; d < z.D; ++d) {
              const double v = double(in[p][size_t(((b * z.N + n) * z.S + s) * z.D + d)]);
              ref[size_t((b * z.S + s) * W + p * C + n * z.D + d)] = v;
              dref[size_t(p * C + n * z.D + d)] += v;
            }
    std::vector<T> first;
    test::with_threads({1, 2, 3}, [&](int threads) {
      INFO("threads " << threads);
      std::vector<T> dx(ref.size(), T(-777)), db(size_t(W), T(-777));
      cpu::qkv_heads_backward<T>(in[0].data(), in[1].data(), in[2].data(), dx.data(), db.data(), z.B, z.S, z.N, z.D);
      CHECK(test::widen(dx) == ref);  // a copy: exact
      test::check_close(db, dref);
      std::vector<T> summed(static_cast<size_t>(W));
      const int64_t x_shape[2] = {z.B * z.S, W}, out_shape[2] = {1, W};
      cpu::sum_to<T>(dx.data(), 2, x_shape, out_shape, summed.data());
      CHECK(db == summed);
      if (threads == 1) first = db;
      else CHECK(db == first);
    });
  }
}

// The fused SwiGLU (passes/fuse_elementwise) against silu(g)·u and its derivatives written out in
// float64, and its backward against float64 finite differences of the forward.
TEMPLATE_TEST_CASE("swiglu and its backward match the naive silu(g)·u", "[kernels][elementwise][backward]", float,
                   double) {
  using T = TestType;
  // 5 and 37 end in a partial vector of 16 lanes; 70,000 crosses runs of 4096 split across threads.
  for (const int64_t n : {int64_t{5}, int64_t{37}, int64_t{70000}}) {
    INFO("n " << n);
    naive::Vec gs = naive::random_normal(n, 1700 + uint32_t(n), 3.0);
    gs[0] = 95.0, gs[1] = -95.0, gs[2] = 20.0, gs[3] = -20.0;  // saturated sigmoid (and exp16's clamp): no NaN
    const auto g = test::cast<T>(gs), u = test::cast<T>(naive::random_normal(n, 1800));
    const auto dy = test::cast<T>(naive::random_normal(n, 1900));
    std::vector<T> h(static_cast<size_t>(n), T(-777)), dg(h), du(h);
    cpu::swiglu<T>(g.data(), u.data(), h.data(), n);
    cpu::swiglu_backward<T>(dy.data(), g.data(), u.data(), dg.data(), du.data(), n);
    naive::Vec ref(static_cast<size_t>(n)), dgref(ref.size()), duref(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double gv = double(g[i]), uv = double(u[i]), d = double(dy[i]);
      ref[i] = naive::silu(gv) * uv;
      dgref[i] = d * uv * naive::silu_grad(gv);
      duref[i] = d * naive::silu(gv);
    }
    test::check_close(h, ref);
    test::check_close(dg, dgref);
    test::check_close(du, duref);
    if constexpr (std::is_same_v<T, double>) {
      if (n > 100) continue;
      // <dy, h(g + t·a, u + t·b)>'s derivative at t = 0 is <dg, a> + <du, b>.
      const naive::Vec a = naive::random_normal(n, 2000), bdir = naive::random_normal(n, 2100);
      auto loss = [&](double t) {
        std::vector<double> gt(g), ut(u), ht(gt.size());
        for (size_t i = 0; i < gt.size(); ++i) gt[i] += t * a[i], ut[i] += t * bdir[i];
        cpu::swiglu<double>(gt.data(), ut.data(), ht.data(), n);
        return test::dot(ht, dy);
      };
      const double eps = 1e-6, fd = (loss(eps) - loss(-eps)) / (2 * eps);
      CHECK(fd == Approx(test::dot(dg, a) + test::dot(du, bdir)).epsilon(1e-7));
    }
  }
}

TEMPLATE_TEST_CASE("sum_to matches the naive sum over broadcast dims", "[kernels][elementwise][backward]", float,
                   double) {
  using T = TestType;
  uint32_t seed = 1500;
  for (const SumToCase& c : kSumToCases) {
    INFO(shape_str(c.x) << " -> " << shape_str(c.out));
    const auto x = test::cast<T>(naive::random_normal(naive::numel(c.x), seed++));
    std::vector<T> out(size_t(naive::numel(c.out)), T(-777));
    cpu::sum_to<T>(x.data(), int(c.x.size()), c.x.data(), c.out.data(), out.data());
    test::check_close(out, naive::sum_to(test::widen(x), c.x, c.out));
  }
}

TEST_CASE("sum_to agrees with central differences of a broadcasting copy", "[kernels][elementwise][backward]") {
  // sum_to is the backward of broadcasting: y = a read with stride 0 on the summed dims.
  uint32_t seed = 1600;
  for (const SumToCase& c : kSumToCases) {
    if (naive::numel(c.x) > 20000 || naive::numel(c.x) == 0) continue;
    INFO(shape_str(c.x) << " -> " << shape_str(c.out));
    const int rank = int(c.x.size());
    std::vector<int64_t> strides(c.x.size());
    for (int64_t d = rank - 1, step = 1; d >= 0; --d) {
      strides[size_t(d)] = c.out[size_t(d)] == 1 ? 0 : step;
      step *= c.out[size_t(d)];
    }
    naive::Vec a = naive::random_normal(naive::numel(c.out), seed++);
    const naive::Vec dy = naive::random_normal(naive::numel(c.x), seed++),
                     u = naive::random_normal(naive::numel(c.out), seed++);
    std::vector<double> y(dy.size()), da(a.size());
    cpu::sum_to<double>(dy.data(), rank, c.x.data(), c.out.data(), da.data());
    test::check_directional(a, u, da, [&] {
      cpu::copy_strided<double>(rank, c.x.data(), a.data(), strides.data(), y.data());
      return test::dot(y, dy);
    });
  }
}

TEMPLATE_TEST_CASE("sum_to and sum_squares do not depend on the thread count",
                   "[kernels][elementwise][backward]", float, double) {
  using T = TestType;
  const auto x = test::cast<T>(naive::random_normal(300 * 3000, 1700));
  for (const SumToCase& c : {SumToCase{{300, 3000}, {1, 3000}}, SumToCase{{900000}, {1}},
                             SumToCase{{9000, 100}, {1, 100}}, SumToCase{{30, 300, 100}, {1, 300, 1}},
                             SumToCase{{3, 300000}, {3, 1}}}) {
    INFO(shape_str(c.x) << " -> " << shape_str(c.out));
    REQUIRE(naive::numel(c.x) == int64_t(x.size()));
    std::vector<T> first;
    test::with_threads({1, 2, 3}, [&](int threads) {
      INFO("threads " << threads);
      std::vector<T> out(static_cast<size_t>(naive::numel(c.out)));
      cpu::sum_to<T>(x.data(), int(c.x.size()), c.x.data(), c.out.data(), out.data());
      if (threads == 1) first = out;
      else CHECK(out == first);
    });
  }
  double first = 0;
  test::with_threads({1, 2, 3}, [&](int threads) {
    const double s = cpu::sum_squares<T>(x.data(), int64_t(x.size()));
    if (threads == 1) first = s;
    else CHECK(s == first);
  });
}

TEMPLATE_TEST_CASE("sum_squares matches the naive sum", "[kernels][elementwise][backward]", float, double) {
  using T = TestType;
  for (const int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(31), int64_t(45), int64_t(100003)}) {
    INFO("n " << n);
    const auto x = test::cast<T>(naive::random_normal(n, 1800 + uint32_t(n)));
    double ref = 0;
    for (T v : x) ref += double(v) * double(v);
    test::check_close(std::vector<double>{cpu::sum_squares<T>(x.data(), n)}, {ref}, 1e-12);
  }
}

// cpu::cast in every direction between f32, f64 and bf16, against naive::round_bf16 (scaling and
// nearbyint, not bit tricks): ties to even, subnormals, overflow to inf, NaN kept NaN; f64 → bf16
// rounds once (a double just past a bf16 tie must not round through f32 to the tie).
TEST_CASE("cast converts between f32, f64 and bf16, rounding to nearest even", "[kernels][elementwise][convert]") {
  std::vector<double> x = {0.0, -0.0, 1.0, -2.5, 1.0 + 0x1p-8, 1.0 + 0x3p-8, -(1.0 + 0x3p-8), 1.0 + 0x1p-8 + 0x1p-40,
                           0x1p-130, 0x1.8p-133, 0x1p-134, 0x1p-140, 3.3e38, 3.4e38, -1e39, 1e300, INFINITY, -INFINITY,
                           std::numeric_limits<double>::quiet_NaN()};
  std::mt19937_64 gen(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_int_distribution<int> ex(-140, 130);
  for (int i = 0; i < 20000; ++i) x.push_back(std::ldexp(nd(gen), ex(gen)));
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> xf(x.begin(), x.end());  // f64 → f32 by the compiler
  std::vector<uint16_t> from64(x.size()), from32(x.size());
  cpu::cast(x.data(), from64.data(), n);
  cpu::cast(xf.data(), from32.data(), n);
  std::vector<float> back32(x.size());
  std::vector<double> back64(x.size()), f32_to_64(x.size());
  std::vector<float> f64_to_32(x.size());
  cpu::cast(from64.data(), back32.data(), n);
  cpu::cast(from64.data(), back64.data(), n);
  cpu::cast(xf.data(), f32_to_64.data(), n);
  cpu::cast(x.data(), f64_to_32.data(), n);
  auto same = [](double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << x[i]);
    REQUIRE(same(bf16_value(from64[i]), naive::round_bf16(x[i])));
    REQUIRE(same(bf16_value(from32[i]), naive::round_bf16(xf[i])));
    REQUIRE(same(back64[i], bf16_value(from64[i])));
    REQUIRE(same(double(back32[i]), bf16_value(from64[i])));
    REQUIRE(same(f32_to_64[i], double(xf[i])));
    REQUIRE(same(double(f64_to_32[i]), double(xf[i])));
  }
  CHECK(from64[5] == 0x3F82);  // 1 + 3·2^-8: tie, odd rounds up
  CHECK(from64[4] == 0x3F80);  // 1 + 2^-8: tie, even stays
  CHECK(from64[7] == 0x3F81);  // just past the tie: up (through f32 it would be the tie, then 0x3F80)
  CHECK(from32[7] == 0x3F80);  // the f32 value is the tie itself
  std::vector<uint16_t> all(0x10000), again(0x10000);  // bf16 → bf16 keeps every non-NaN pattern
  std::iota(all.begin(), all.end(), uint16_t{0});
  cpu::cast(all.data(), again.data(), 0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h)
    if (!std::isnan(bf16_value(uint16_t(h)))) REQUIRE(again[h] == h);
}
