// CPU flash-style sdpa_forward against the naive attention that materialises every score: GQA,
// causal (bottom-right aligned, including Sq > Skv rows that see no key) and non-causal, Sq ≠ Skv,
// lengths that are not multiples of the blocks, odd head dims, and the optional lse output.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/attention.h"

namespace {

using namespace autosp;

struct SdpaCase {
  int64_t B, N, Nkv, Sq, Skv, D;
  bool causal;
  double scale;  // 0: 1/sqrt(D)
};

const SdpaCase kSdpaCases[] = {
    {1, 1, 1, 1, 1, 8, false, 0},
    {1, 1, 1, 1, 1, 8, true, 0},
    {2, 2, 2, 7, 7, 16, true, 0},
    {1, 8, 2, 65, 65, 64, true, 0},    // GQA
    {1, 8, 2, 65, 65, 64, false, 0},
    {2, 4, 4, 130, 130, 16, true, 0},
    {1, 2, 1, 130, 130, 8, false, 0},
    {1, 2, 2, 7, 130, 16, false, 0},   // Sq < Skv
    {2, 4, 2, 65, 7, 64, false, 0},    // Sq > Skv
    {1, 2, 2, 7, 130, 16, true, 0},    // causal, bottom-right: query i sees keys ≤ i + 123
    {1, 4, 2, 65, 130, 8, true, 0},
    {1, 2, 1, 130, 65, 16, true, 0},   // causal, Sq > Skv: the first 65 queries see nothing
    {1, 3, 3, 33, 70, 3, true, 0},     // odd head dims
    {1, 2, 2, 66, 129, 100, false, 0},
    {1, 2, 2, 200, 200, 128, true, 0}, // D = 128: smaller query blocks
    {1, 2, 1, 65, 65, 16, true, 2.0},  // large scale: wide exp range
    {1, 1, 1, 3, 0, 8, false, 0},      // no keys at all
};

}  // namespace

TEMPLATE_TEST_CASE("sdpa_forward matches the naive attention", "[kernels][attention]", float, double) {
  using T = TestType;
  uint32_t seed = 300;
  for (const SdpaCase& c : kSdpaCases) {
    INFO("B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " Sq " << c.Sq << " Skv " << c.Skv
              << " D " << c.D << " causal " << c.causal << " scale " << c.scale);
    const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
    const auto q = test::cast<T>(naive::random_normal(c.B * c.N * c.Sq * c.D, seed++));
    const auto k = test::cast<T>(naive::random_normal(c.B * c.Nkv * c.Skv * c.D, seed++));
    const auto v = test::cast<T>(naive::random_normal(c.B * c.Nkv * c.Skv * c.D, seed++));
    std::vector<T> o(q.size(), T(-777)), lse(static_cast<size_t>(c.B * c.N * c.Sq), T(-777));
    cpu::sdpa_forward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.Sq,
                         c.Skv, c.D, scale, c.causal);
    naive::Vec ref_lse;
    const naive::Vec ref = naive::sdpa(test::widen(q), test::widen(k), test::widen(v), c.B, c.N,
                                       c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, &ref_lse);
    test::check_close(o, ref);
    test::check_close(lse, ref_lse);
    std::vector<T> o2(q.size(), T(-777));  // lse is optional
    cpu::sdpa_forward<T>(q.data(), k.data(), v.data(), o2.data(), nullptr, c.B, c.N, c.Nkv, c.Sq,
                         c.Skv, c.D, scale, c.causal);
    CHECK(o2 == o);
  }
}

TEST_CASE("sdpa_forward causal masking hides future keys", "[kernels][attention]") {
  // One head, D = 1, q = 1, k = 0: every visible key has the same score, so o[i] is the mean of
  // the visible values. v[j] = j, so o[i] = i / 2 for a square causal mask.
  const int64_t S = 150;
  std::vector<double> q(S, 1.0), k(S, 0.0), v(S), o(S);
  for (int64_t j = 0; j < S; ++j) v[size_t(j)] = double(j);
  cpu::sdpa_forward<double>(q.data(), k.data(), v.data(), o.data(), nullptr, 1, 1, 1, S, S, 1, 1.0,
                            true);
  for (int64_t i = 0; i < S; ++i) CHECK(o[size_t(i)] == Approx(double(i) / 2).epsilon(1e-12));
}
