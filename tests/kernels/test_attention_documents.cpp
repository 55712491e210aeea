// The CPU flash attention with a document mask (packed documents, doc_start) against the naive
// attention that materialises every score and masks it element by element (tests/common/naive.h):
// forward (o, lse) and backward (dq, dk, dv), f32 and f64, GQA, documents shorter and
// longer than the kernels' tiles (forward 128 × 512, backward 64 × 256), a single document (equal
// to plain causal attention, bit for bit), one-token documents, and starts that are not
// nondecreasing (the kernel must still be right, only slower).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/attention.h"

namespace {

using namespace autosp;

struct DocCase {
  int64_t B, N, Nkv, S, D;
  int64_t min_len, max_len;  // document lengths drawn uniformly from [min_len, max_len]
};

const DocCase kDocCases[] = {
    {1, 1, 1, 9, 8, 1, 3},
    {2, 2, 1, 70, 16, 5, 20},        // GQA, several documents per row
    {1, 4, 2, 300, 16, 1, 1},        // one-token documents: every row sees only itself
    {1, 2, 2, 700, 64, 50, 300},     // documents across forward and backward tiles
    {1, 2, 1, 1100, 16, 100, 600},   // several key tiles of 512, partial tiles
    {2, 2, 2, 257, 128, 30, 90},     // D = 128
    {1, 1, 1, 200, 8, 200, 200},     // one document spanning the whole row
    {2, 4, 2, 300, 32, 20, 90},      // D = 32: the transposed forward, masked fused backward tiles
};

// Document ids [B, S]: consecutive runs with random lengths, each row drawn independently.
std::vector<int64_t> random_documents(const DocCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> len(c.min_len, c.max_len);
  std::vector<int64_t> ids(static_cast<size_t>(c.B * c.S));
  for (int64_t b = 0; b < c.B; ++b) {
    int64_t doc = 0, left = len(rng);
    for (int64_t t = 0; t < c.S; ++t) {
      if (left == 0) ++doc, left = len(rng);
      ids[size_t(b * c.S + t)] = doc;
      --left;
    }
  }
  return ids;
}

// doc_start [B, S] of document ids: where each token's run of equal ids begins.
std::vector<int64_t> starts_of(const std::vector<int64_t>& ids, int64_t B, int64_t S) {
  std::vector<int64_t> start(ids.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      const size_t i = size_t(b * S + t);
      start[i] = t > 0 && ids[i] == ids[i - 1] ? start[i - 1] : t;
    }
  return start;
}

}  // namespace

TEMPLATE_TEST_CASE("sdpa with a document mask matches the naive block-diagonal attention",
                   "[kernels][attention][documents]", float, double) {
  using T = TestType;
  uint32_t seed = 900;
  for (const DocCase& c : kDocCases) {
    INFO("B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " S " << c.S << " D " << c.D << " documents of "
              << c.min_len << ".." << c.max_len);
    const double scale = 1.0 / std::sqrt(double(c.D));
    const auto ids = random_documents(c, seed++);
    const auto starts = starts_of(ids, c.B, c.S);
    const auto q = test::cast<T>(naive::random_normal(c.B * c.N * c.S * c.D, seed++));
    const auto k = test::cast<T>(naive::random_normal(c.B * c.Nkv * c.S * c.D, seed++));
    const auto v = test::cast<T>(naive::random_normal(c.B * c.Nkv * c.S * c.D, seed++));
    const auto dout = test::cast<T>(naive::random_normal(c.B * c.N * c.S * c.D, seed++));
    std::vector<T> o(q.size(), T(-777)), lse(size_t(c.B * c.N * c.S), T(-777));
    cpu::sdpa_forward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.S, c.S, c.D, scale,
                         true, starts.data());
    naive::Vec ref_lse;
    const naive::Vec ref = naive::sdpa(test::widen(q), test::widen(k), test::widen(v), c.B, c.N, c.Nkv, c.S, c.S,
                                       c.D, scale, true, &ref_lse, &starts);
    test::check_close(o, ref);
    test::check_close(lse, ref_lse);

    std::vector<T> dq(q.size(), T(-777)), dk(k.size(), T(-777)), dv(v.size(), T(-777));
    cpu::sdpa_backward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                          dv.data(), c.B, c.N, c.Nkv, c.S, c.S, c.D, scale, true, starts.data());
    naive::Vec ref_dq, ref_dk, ref_dv;
    naive::sdpa_backward(test::widen(q), test::widen(k), test::widen(v), test::widen(dout), c.B, c.N, c.Nkv, c.S,
                         c.S, c.D, scale, true, ref_dq, ref_dk, ref_dv, &starts);
    test::check_close(dq, ref_dq);
    test::check_close(dk, ref_dk);
    test::check_close(dv, ref_dv);
    for (T x : o) REQUIRE(std::isfinite(double(x)));
    for (T x : dq) REQUIRE(std::isfinite(double(x)));
  }
}

TEST_CASE("sdpa with a single document equals causal attention bit for bit", "[kernels][attention][documents]") {
  const int64_t B = 2, N = 2, Nkv = 1, S = 600, D = 16;
  const double scale = 0.25;
  const auto q = test::cast<float>(naive::random_normal(B * N * S * D, 11));
  const auto k = test::cast<float>(naive::random_normal(B * Nkv * S * D, 12));
  const auto v = test::cast<float>(naive::random_normal(B * Nkv * S * D, 13));
  const auto dout = test::cast<float>(naive::random_normal(B * N * S * D, 14));
  const std::vector<int64_t> zeros(size_t(B * S), 0);
  std::vector<float> o1(q.size()), o2(q.size()), l1(size_t(B * N * S)), l2(l1.size());
  cpu::sdpa_forward<float>(q.data(), k.data(), v.data(), o1.data(), l1.data(), B, N, Nkv, S, S, D, scale, true);
  cpu::sdpa_forward<float>(q.data(), k.data(), v.data(), o2.data(), l2.data(), B, N, Nkv, S, S, D, scale, true,
                           zeros.data());
  CHECK(o1 == o2);
  CHECK(l1 == l2);
  std::vector<float> dq1(q.size()), dk1(k.size()), dv1(v.size()), dq2(q.size()), dk2(k.size()), dv2(v.size());
  cpu::sdpa_backward<float>(q.data(), k.data(), v.data(), o1.data(), l1.data(), dout.data(), dq1.data(), dk1.data(),
                            dv1.data(), B, N, Nkv, S, S, D, scale, true);
  cpu::sdpa_backward<float>(q.data(), k.data(), v.data(), o1.data(), l1.data(), dout.data(), dq2.data(), dk2.data(),
                            dv2.data(), B, N, Nkv, S, S, D, scale, true, zeros.data());
  CHECK(dq1 == dq2);
  CHECK(dk1 == dk2);
  CHECK(dv1 == dv2);
}

TEST_CASE("sdpa with starts that are not nondecreasing still masks each row exactly",
          "[kernels][attention][documents]") {
  // Row i sees keys [start[i], i]: with starts drawn at random in [0, i] this is no longer a set
  // of documents, but every row's window is still well defined; the naive reference is written
  // here as that window.
  const int64_t B = 1, N = 2, Nkv = 2, S = 530, D = 16;
  const double scale = 1.0 / 4;
  std::mt19937 rng(5);
  std::vector<int64_t> start(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) start[size_t(i)] = std::uniform_int_distribution<int64_t>(0, i)(rng);
  const auto q = naive::random_normal(B * N * S * D, 21), k = naive::random_normal(B * Nkv * S * D, 22);
  const auto v = naive::random_normal(B * Nkv * S * D, 23);
  std::vector<double> o(q.size()), lse(size_t(B * N * S));
  cpu::sdpa_forward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), B, N, Nkv, S, S, D, scale, true,
                            start.data());
  double worst = 0;
  for (int64_t h = 0; h < N; ++h)
    for (int64_t i = 0; i < S; ++i) {
      double mx = -INFINITY;
      std::vector<double> s(size_t(S), -INFINITY);
      for (int64_t j = start[size_t(i)]; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[size_t((h * S + i) * D + d)] * k[size_t((h * S + j) * D + d)];
        s[size_t(j)] = dot * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double sum = 0;
      for (int64_t j = start[size_t(i)]; j <= i; ++j) sum += std::exp(s[size_t(j)] - mx);
      for (int64_t d = 0; d < D; ++d) {
        double ref = 0;
        for (int64_t j = start[size_t(i)]; j <= i; ++j) ref += std::exp(s[size_t(j)] - mx) / sum * v[size_t((h * S + j) * D + d)];
        worst = std::max(worst, std::abs(ref - o[size_t((h * S + i) * D + d)]));
      }
      worst = std::max(worst, std::abs(mx + std::log(sum) - lse[size_t(h * S + i)]));
    }
  CHECK(worst < 1e-10);
}
