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

// The float32 order tests' [1, N, S, D] rows: for head n, position s and pair i (entries lo = row + i
// and hi = row + i + D/2), cos and sin of the angle as LlamaRotaryEmbedding computes it in float32:
// inv_freq = 1.0 / (theta ** (arange(0, D, 2).float() / D)), freqs = inv_freq · position_ids.float().
// `check(lo, hi, cos, sin)` runs under an INFO naming the entry.
template <class F>
void for_each_hf_pair(int64_t N, int64_t S, int64_t D, float theta, const std::vector<int64_t>& pos, F&& check) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0; i < D / 2; ++i) {
        const float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(D));
        const float angle = float(pos[size_t(s)]) * inv_freq;
        const float c = std::cos(angle), sn = std::sin(angle);
        const size_t row = size_t((n * S + s) * D);
        INFO("n " << n << " s " << s << " i " << i);
        check(row + size_t(i), row + size_t(i + D / 2), c, sn);
      }
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
  // LlamaRotaryEmbedding in float32 (for_each_hf_pair's cos and sin): q·cos + rotate_half(q)·sin.
  const int64_t B = 1, N = 2, S = 5, D = 64;
  const float theta = 500000.0f;
  const std::vector<int64_t> pos = {0, 1, 17, 1000, 8191};
  const auto x = test::cast<float>(naive::random_normal(B * N * S * D, 77));
  std::vector<float> y(x.size());
  cpu::rope_forward<float>(x.data(), pos.data(), y.data(), B, N, S, D, double(theta));
  for_each_hf_pair(N, S, D, theta, pos, [&](size_t l, size_t h, float c, float sn) {
    const float x1 = x[l], x2 = x[h];
    const float lo = x1 * c, lo_rot = -x2 * sn, hi = x2 * c, hi_rot = x1 * sn;
    REQUIRE(y[l] == lo + lo_rot);
    REQUIRE(y[h] == hi + hi_rot);
  });
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
  for_each_hf_pair(N, S, D, theta, pos, [&](size_t l, size_t h, float c, float sn) {
    const float g1 = dy[l], g2 = dy[h];
    const float lo = g1 * c, lo_rot = g2 * sn, hi = g2 * c, hi_rot = -(g1 * sn);
    REQUIRE(dx[l] == lo + lo_rot);
    REQUIRE(dx[h] == hi + hi_rot);
  });
}

// ---- rope_scaling (Hugging Face's linear and llama3) ------------------------------------------

namespace {

// transformers 4.44 _compute_llama3_parameters, transcribed to plain double loops.
std::vector<double> llama3_inv_freq(int64_t D, double theta, double factor, double low, double high, double old_len) {
  std::vector<double> out;
  for (int64_t i = 0; i < D; i += 2) {
    const double f = 1.0 / std::pow(theta, double(i) / double(D));
    const double wavelen = 2 * M_PI / f;
    if (wavelen < old_len / high) {
      out.push_back(f);
    } else if (wavelen > old_len / low) {
      out.push_back(f / factor);
    } else {
      const double smooth = (old_len / wavelen - low) / (high - low);
      out.push_back((1 - smooth) * f / factor + smooth * f);
    }
  }
  return out;
}

// y = x·cos(p·f) + rotate_half(x)·sin(p·f) with the given inv_freq f, in double.
std::vector<double> rope_with(const std::vector<double>& x, const std::vector<int64_t>& pos, int64_t B, int64_t N,
                              int64_t S, int64_t D, const std::vector<double>& inv_freq) {
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double a = double(pos[size_t(b * S + s)]) * inv_freq[size_t(i)];
          const size_t row = size_t(((b * N + n) * S + s) * D);
          const double lo = x[row + size_t(i)], hi = x[row + size_t(i + D / 2)];
          y[row + size_t(i)] = lo * std::cos(a) - hi * std::sin(a);
          y[row + size_t(i + D / 2)] = hi * std::cos(a) + lo * std::sin(a);
        }
  return y;
}

}  // namespace

TEST_CASE("rope_inv_freq with llama3 scaling follows transformers' formula", "[kernels][rope][rope_scaling]") {
  // Llama 3.1's setting (factor 8, 1, 4, 8192) at D 128, and a small one where every band occurs.
  struct Case {
    int64_t D;
    double theta, factor, low, high, old_len;
  };
  for (const Case c : {Case{128, 500000.0, 8, 1, 4, 8192}, Case{8, 100.0, 8, 1, 4, 32}, Case{16, 10000.0, 4, 2, 8, 64}}) {
    INFO("D " << c.D << " theta " << c.theta << " original " << c.old_len);
    cpu::RopeScaling s{cpu::RopeScaling::llama3, c.factor, c.low, c.high, c.old_len};
    const auto want = llama3_inv_freq(c.D, c.theta, c.factor, c.low, c.high, c.old_len);
    std::vector<double> got(size_t(c.D / 2));
    std::vector<float> got_f(size_t(c.D / 2));
    cpu::rope_inv_freq(got.data(), c.D, c.theta, s);
    cpu::rope_inv_freq(got_f.data(), c.D, c.theta, s);
    test::check_close(got, want, 1e-14);
    test::check_close(test::widen(got_f), want, 1e-6);
    // and it is not the unscaled inv_freq (the low band is divided by factor)
    std::vector<double> plain(size_t(c.D / 2));
    cpu::rope_inv_freq(plain.data(), c.D, c.theta, {});
    CHECK(got.back() == Approx(plain.back() / c.factor).epsilon(1e-12));
  }
}

TEST_CASE("rope_forward with rope_scaling: llama3 against the naive rotation, linear as interpolated positions",
          "[kernels][rope][rope_scaling]") {
  const int64_t B = 2, N = 3, S = 9, D = 16;
  const naive::Vec x = naive::random_normal(B * N * S * D, 4100);
  const auto pos = random_positions(B * S, 4101, 4096);
  std::vector<double> y(x.size()), dx(x.size());
  const cpu::RopeScaling l3{cpu::RopeScaling::llama3, 8, 1, 4, 64};
  cpu::rope_forward<double>(x.data(), pos.data(), y.data(), B, N, S, D, 10000.0, l3);
  test::check_close(y, rope_with(x, pos, B, N, S, D, llama3_inv_freq(D, 10000.0, 8, 1, 4, 64)), 1e-11);
  // The backward is still the transposed rotation: <rope(x), dy> = <x, rope_backward(dy)>.
  const naive::Vec dy = naive::random_normal(B * N * S * D, 4102);
  cpu::rope_backward<double>(dy.data(), pos.data(), dx.data(), B, N, S, D, 10000.0, l3);
  CHECK(test::dot(y, dy) == Approx(test::dot(x, dx)).epsilon(1e-12));
  // linear, factor 4: position 4p rotates as position p unscaled.
  std::vector<int64_t> pos4(pos.size()), pos1(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) pos1[i] = pos[i] / 4, pos4[i] = 4 * (pos[i] / 4);
  std::vector<double> scaled(x.size()), plain(x.size());
  cpu::rope_forward<double>(x.data(), pos4.data(), scaled.data(), B, N, S, D, 10000.0, {cpu::RopeScaling::linear, 4});
  cpu::rope_forward<double>(x.data(), pos1.data(), plain.data(), B, N, S, D, 10000.0);
  test::check_close(scaled, plain, 1e-12);
}
