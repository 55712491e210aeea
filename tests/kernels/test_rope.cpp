// CPU rope_forward: double against the naive double RoPE; float against the same reference at small
// positions, and bit for bit against Hugging Face's float32 order of operations at large ones.
// rope_backward: against the naive transposed rotation, central differences of rope_forward
// (double), and bit for bit against PyTorch autograd's float32 order.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")  // the expected values round each product, like PyTorch
#endif
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/rope.h"

namespace {

using namespace autosp;

struct RopeCase {
  int64_t B, N, S, D;
  double theta;
};
const RopeCase kRopeCases[] = {
    {1, 1, 1, 2, 10000.0}, {2, 3, 7, 8, 10000.0}, {1, 8, 65, 64, 500000.0}, {2, 2, 130, 16, 10000.0},
    {1, 4, 33, 128, 1e6},
};

std::vector<int64_t> random_positions(int64_t n, uint32_t seed, int64_t max_pos) {
  std::mt19937 gen(seed);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t& p : pos) p = int64_t(gen() % uint32_t(max_pos));
  return pos;
}

}  // namespace

TEST_CASE("rope_forward<double> matches the naive RoPE", "[kernels][rope]") {
  uint32_t seed = 500;
  for (const RopeCase& c : kRopeCases) {
    INFO("B " << c.B << " N " << c.N << " S " << c.S << " D " << c.D << " theta " << c.theta);
    const naive::Vec x = naive::random_normal(c.B * c.N * c.S * c.D, seed++);
    const auto pos = random_positions(c.B * c.S, seed++, 8192);
    std::vector<double> y(x.size(), -777.0);
    cpu::rope_forward<double>(x.data(), pos.data(), y.data(), c.B, c.N, c.S, c.D, c.theta);
    // Angles up to 8192 carry ~pos·ε absolute rounding in any double formula: 1e-11, not 1e-12.
    test::check_close(y, naive::rope(x, pos, c.B, c.N, c.S, c.D, c.theta), 1e-11);
  }
}

TEST_CASE("rope_forward<float> matches the naive RoPE at small positions", "[kernels][rope]") {
  uint32_t seed = 600;
  for (const RopeCase& c : kRopeCases) {
    INFO("B " << c.B << " N " << c.N << " S " << c.S << " D " << c.D << " theta " << c.theta);
    // float angles carry a relative error of ~1e-7, so positions stay small for a 1e-5 comparison.
    const auto x = test::cast<float>(naive::random_normal(c.B * c.N * c.S * c.D, seed++));
    const auto pos = random_positions(c.B * c.S, seed++, 16);
    std::vector<float> y(x.size(), -777.0f);
    cpu::rope_forward<float>(x.data(), pos.data(), y.data(), c.B, c.N, c.S, c.D, c.theta);
    test::check_close(y, naive::rope(test::widen(x), pos, c.B, c.N, c.S, c.D, c.theta));
  }
}

TEST_CASE("rope_forward<float> follows Hugging Face's float32 operation order", "[kernels][rope]") {
  // LlamaRotaryEmbedding in float32: inv_freq = 1.0 / (theta ** (arange(0, D, 2).float() / D)),
  // freqs = inv_freq · position_ids.float(), cos/sin of freqs, q·cos + rotate_half(q)·sin.
  const int64_t B = 1, N = 2, S = 5, D = 64;
  const float theta = 500000.0f;
  const std::vector<int64_t> pos = {0, 1, 17, 1000, 8191};
  const auto x = test::cast<float>(naive::random_normal(B * N * S * D, 77));
  std::vector<float> y(x.size());
  cpu::rope_forward<float>(x.data(), pos.data(), y.data(), B, N, S, D, double(theta));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0; i < D / 2; ++i) {
        const float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(D));
        const float angle = float(pos[size_t(s)]) * inv_freq;
        const float c = std::cos(angle), sn = std::sin(angle);
        const size_t row = size_t((n * S + s) * D);
        const float x1 = x[row + size_t(i)], x2 = x[row + size_t(i + D / 2)];
        const float lo = x1 * c, lo_rot = -x2 * sn, hi = x2 * c, hi_rot = x1 * sn;
        INFO("n " << n << " s " << s << " i " << i);
        REQUIRE(y[row + size_t(i)] == lo + lo_rot);
        REQUIRE(y[row + size_t(i + D / 2)] == hi + hi_rot);
      }
}

TEMPLATE_TEST_CASE("rope_backward matches the naive transposed rotation", "[kernels][rope][backward]", float,
                   double) {
  using T = TestType;
  uint32_t seed = 3200;
  for (const RopeCase& c : kRopeCases) {
    INFO("B " << c.B << " N " << c.N << " S " << c.S << " D " << c.D << " theta " << c.theta);
    const auto dy = test::cast<T>(naive::random_normal(c.B * c.N * c.S * c.D, seed++));
    // float angles lose ~pos·ε: small positions for float, large ones for double (see above).
    const auto pos = random_positions(c.B * c.S, seed++, sizeof(T) == 4 ? 16 : 8192);
    std::vector<T> dx(dy.size(), T(-777));
    cpu::rope_backward<T>(dy.data(), pos.data(), dx.data(), c.B, c.N, c.S, c.D, c.theta);
    test::check_close(dx, naive::rope_backward(test::widen(dy), pos, c.B, c.N, c.S, c.D, c.theta),
                      sizeof(T) == 4 ? 1e-5 : 1e-11);
  }
}

TEST_CASE("rope_backward agrees with central differences of rope_forward", "[kernels][rope][backward]") {
  const int64_t B = 2, N = 3, S = 7, D = 8;
  naive::Vec x = naive::random_normal(B * N * S * D, 3300);
  const naive::Vec dy = naive::random_normal(B * N * S * D, 3301);
  const auto pos = random_positions(B * S, 3302, 4096);
  std::vector<double> y(x.size()), dx(x.size());
  cpu::rope_backward<double>(dy.data(), pos.data(), dx.data(), B, N, S, D, 10000.0);
  test::check_directional(x, naive::random_normal(B * N * S * D, 3303), dx, [&] {
    cpu::rope_forward<double>(x.data(), pos.data(), y.data(), B, N, S, D, 10000.0);
    return test::dot(y, dy);
  });
}

TEST_CASE("rope_backward<float> follows PyTorch autograd's float32 operation order", "[kernels][rope][backward]") {
  // Autograd of q·cos + rotate_half(q)·sin: dq = dy·cos + rotate_halfᵀ(dy·sin), rotate_halfᵀ(z) =
  // cat(z[D/2:], -z[:D/2]).
  const int64_t B = 1, N = 2, S = 5, D = 64;
  const float theta = 500000.0f;
  const std::vector<int64_t> pos = {0, 1, 17, 1000, 8191};
  const auto dy = test::cast<float>(naive::random_normal(B * N * S * D, 78));
  std::vector<float> dx(dy.size());
  cpu::rope_backward<float>(dy.data(), pos.data(), dx.data(), B, N, S, D, double(theta));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0; i < D / 2; ++i) {
        const float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(D));
        const float angle = float(pos[size_t(s)]) * inv_freq;
        const float c = std::cos(angle), sn = std::sin(angle);
        const size_t row = size_t((n * S + s) * D);
        const float g1 = dy[row + size_t(i)], g2 = dy[row + size_t(i + D / 2)];
        const float lo = g1 * c, lo_rot = g2 * sn, hi = g2 * c, hi_rot = -(g1 * sn);
        INFO("n " << n << " s " << s << " i " << i);
        REQUIRE(dx[row + size_t(i)] == lo + lo_rot);
        REQUIRE(dx[row + size_t(i + D / 2)] == hi + hi_rot);
      }
}
