// CPU flash-style sdpa_forward against the naive attention that materialises every score: GQA,
// causal (bottom-right aligned, including Sq > Skv rows that see no key) and non-causal, Sq ≠ Skv,
// lengths that are not multiples of the blocks, odd head dims, head dims below 32 (the transposed
// tiles), and the optional lse output.
// Backward: against the naive textbook backward on the materialised probabilities over the same
// kind of table, against central differences of sdpa_forward (double), and bitwise across thread
// counts.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/attention.h"

namespace {

using namespace autosp;

// Which of the table's tests take a case.
enum class Runs { both, forward, backward };

struct SdpaCase {
  int64_t B, N, Nkv, Sq, Skv, D;
  bool causal;
  double scale;  // 0: 1/sqrt(D)
  Runs runs = Runs::both;
};

std::ostream& operator<<(std::ostream& os, const SdpaCase& c) {
  return os << "B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " Sq " << c.Sq << " Skv " << c.Skv
            << " D " << c.D << " causal " << c.causal << " scale " << c.scale;
}

// The shapes of the forward and the backward tests against the naive attention: each test takes the
// rows it runs, in order.
const SdpaCase kSdpaCases[] = {
    {1, 1, 1, 1, 1, 8, false, 0},
    {1, 1, 1, 1, 1, 8, true, 0},
    {2, 2, 2, 7, 7, 16, true, 0},
    {1, 8, 2, 65, 65, 64, true, 0},    // GQA
    {1, 8, 2, 65, 65, 64, false, 0, Runs::forward},
    {1, 6, 2, 65, 65, 32, false, 0, Runs::backward},
    {2, 4, 4, 130, 130, 16, true, 0},  // several key and query blocks
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
    {1, 2, 1, 0, 5, 8, true, 0, Runs::backward},  // no queries at all
    // Several query and key tiles of the kernels (forward 128 x 512, backward 64 x 256), with
    // partial last tiles and causal blocks skipped on both sides of the diagonal.
    {1, 2, 1, 300, 1100, 16, true, 0, Runs::forward},
    {1, 1, 1, 530, 530, 64, false, 0, Runs::forward},
    {1, 2, 2, 700, 700, 128, true, 0, Runs::forward},
    {1, 2, 1, 150, 600, 16, true, 0, Runs::backward},
    {1, 1, 1, 300, 300, 64, false, 0, Runs::backward},
    // Head dims below 32 run transposed tiles (keys x queries): GQA over 6 query blocks and 2 key
    // blocks, and D = 24, not a multiple of the vector width. The backward accumulates dK, dV
    // transposed and fuses P, dS into the score products of whole tiles (11 query blocks in several
    // chunks).
    {1, 4, 2, 700, 700, 16, true, 0},
    {1, 4, 2, 700, 700, 24, true, 0},
    // D = 32 runs them too, in query blocks of 64: a short causal sequence whose query blocks cut
    // their one key block into the keys every row sees and the diagonal tile (fused products, masked
    // on the diagonal in the backward; decision 271), and a full one.
    {2, 4, 2, 256, 256, 32, true, 0},
    {1, 2, 1, 300, 300, 32, false, 0, Runs::forward},
    // A task's keys and values transposed once (decision 272) take 2 · 128 · 4216 floats, past the
    // 2^18 of the task panels: each tile transposes its own keys.
    {1, 2, 1, 70, 4200, 128, false, 0, Runs::backward},
};

// A case's q [B, N, Sq, D], k and v [B, Nkv, Skv, D] from N(0, 1) (seeds `seed`, `seed` + 1,
// `seed` + 2; `seed` moves past them) and its scale.
template <class T>
struct SdpaInputs {
  std::vector<T> q, k, v;
  double scale;
};
template <class T>
SdpaInputs<T> sdpa_inputs(const SdpaCase& c, uint32_t& seed) {
  SdpaInputs<T> in;
  in.q = test::cast<T>(naive::random_normal(c.B * c.N * c.Sq * c.D, seed++));
  in.k = test::cast<T>(naive::random_normal(c.B * c.Nkv * c.Skv * c.D, seed++));
  in.v = test::cast<T>(naive::random_normal(c.B * c.Nkv * c.Skv * c.D, seed++));
  in.scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
  return in;
}

}  // namespace

TEMPLATE_TEST_CASE("sdpa_forward matches the naive attention", "[kernels][attention]", float, double) {
  using T = TestType;
  uint32_t seed = 300;
  for (const SdpaCase& c : kSdpaCases) {
    if (c.runs == Runs::backward) continue;
    INFO(c);
    const auto [q, k, v, scale] = sdpa_inputs<T>(c, seed);
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

TEST_CASE("sdpa_forward at D < 32: a dominant key sets the row maximum wherever it lies in a tile",
          "[kernels][attention]") {
  // Every query is 3·(1, ..., 1) and one key 10·(1, ..., 1): its scaled score is 120, the others'
  // about N(0, 3²), so the softmax holds it alone (o = its value row) and only a running max that
  // includes it keeps exp(score - max) finite: a max that misses one row of a tile (the transposed
  // forward takes it from the score product's register tiles) turns the output into inf or NaN.
  // The key moves through the rows of the 6- and 4-row register tiles of both key blocks (the second
  // one partial), in causal and full attention.
  const int64_t S = 700, D = 16, N = 2;
  const double scale = 1.0 / std::sqrt(double(D));
  for (const bool causal : {false, true})
    for (const int64_t hot : {0, 5, 6, 11, 100, 509, 511, 512, 517, 690, 699}) {
      INFO("causal " << causal << " dominant key " << hot);
      std::vector<float> q(size_t(N * S * D), 3.0f), o(q.size()), lse(size_t(N * S));
      auto k = test::cast<float>(naive::random_normal(S * D, 4100 + uint32_t(hot)));
      const auto v = test::cast<float>(naive::random_normal(S * D, 4200 + uint32_t(hot)));
      for (int64_t d = 0; d < D; ++d) k[size_t(hot * D + d)] = 10.0f;
      cpu::sdpa_forward<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), 1, N, 1, S, S, D, scale, causal);
      naive::Vec ref_lse;
      const naive::Vec ref = naive::sdpa(test::widen(q), test::widen(k), test::widen(v), 1, N, 1, S, S, D, scale,
                                         causal, &ref_lse);
      test::check_close(o, ref);
      test::check_close(lse, ref_lse);
    }
}

// ---- backward ----------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("sdpa_backward matches the naive backward", "[kernels][attention][backward]", float, double) {
  using T = TestType;
  uint32_t seed = 2300;
  for (const SdpaCase& c : kSdpaCases) {
    if (c.runs == Runs::forward) continue;
    INFO(c);
    const auto [q, k, v, scale] = sdpa_inputs<T>(c, seed);
    const auto dout = test::cast<T>(naive::random_normal(c.B * c.N * c.Sq * c.D, seed++));
    std::vector<T> o(q.size()), lse(static_cast<size_t>(c.B * c.N * c.Sq));
    cpu::sdpa_forward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D,
                         scale, c.causal);
    std::vector<T> dq(q.size(), T(-777)), dk(k.size(), T(-777)), dv(v.size(), T(-777));
    cpu::sdpa_backward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                          dv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal);
    naive::Vec ref_dq, ref_dk, ref_dv;
    naive::sdpa_backward(test::widen(q), test::widen(k), test::widen(v), test::widen(dout), c.B, c.N, c.Nkv, c.Sq,
                         c.Skv, c.D, scale, c.causal, ref_dq, ref_dk, ref_dv);
    // A scale of 2 at D = 16 puts the scores far out (|scale · q·k| near 30), and each P = exp(s - lse)
    // carries the f32 rounding of an argument that large (about 2e-6 relative) into the sums: four
    // times the unit-scale bound. (The sanitizer build's -O1 code landed at 1.1e-5 on one entry.)
    const double tol = test::tol<T>() * (c.scale > 1 ? 4 : 1);
    test::check_close(dq, ref_dq, tol);
    test::check_close(dk, ref_dk, tol);
    test::check_close(dv, ref_dv, tol);
    if (c.causal && c.Sq > c.Skv) {  // queries that see no key get exactly zero
      const int64_t blind = c.Sq - c.Skv;
      for (int64_t bh = 0; bh < c.B * c.N; ++bh)
        for (int64_t i = 0; i < blind * c.D; ++i) REQUIRE(dq[size_t(bh * c.Sq * c.D + i)] == T(0));
    }
  }
}

TEST_CASE("sdpa_backward agrees with central differences of sdpa_forward", "[kernels][attention][backward]") {
  const SdpaCase cases[] = {
      {1, 2, 1, 9, 9, 4, true, 0},     {1, 4, 2, 7, 13, 8, false, 0}, {1, 2, 2, 13, 7, 4, true, 0},
      {2, 2, 1, 70, 70, 8, true, 0},   {1, 2, 1, 70, 5, 8, false, 0}, {1, 1, 1, 5, 80, 6, true, 1.5},
  };
  uint32_t seed = 2400;
  for (const SdpaCase& c : cases) {
    INFO(c);
    const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
    const int64_t nq = c.B * c.N * c.Sq * c.D, nkv = c.B * c.Nkv * c.Skv * c.D;
    naive::Vec q = naive::random_normal(nq, seed++), k = naive::random_normal(nkv, seed++),
               v = naive::random_normal(nkv, seed++);
    const naive::Vec dout = naive::random_normal(nq, seed++);
    std::vector<double> o(static_cast<size_t>(nq)), lse(static_cast<size_t>(c.B * c.N * c.Sq));
    auto loss = [&] {
      cpu::sdpa_forward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv,
                                c.D, scale, c.causal);
      return test::dot(o, dout);
    };
    loss();  // o, lse at the unperturbed inputs
    std::vector<double> dq(static_cast<size_t>(nq)), dk(static_cast<size_t>(nkv)), dv(static_cast<size_t>(nkv));
    cpu::sdpa_backward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                               dk.data(), dv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal);
    test::check_directional(q, naive::random_normal(nq, seed++), dq, loss);
    test::check_directional(k, naive::random_normal(nkv, seed++), dk, loss);
    test::check_directional(v, naive::random_normal(nkv, seed++), dv, loss);
  }
}

TEMPLATE_TEST_CASE("sdpa_backward does not depend on the thread count", "[kernels][attention][backward]", float,
                   double) {
  using T = TestType;
  const int64_t B = 2, N = 4, Nkv = 2, S = 130, D = 32;
  const double scale = 1.0 / std::sqrt(double(D));
  const auto q = test::cast<T>(naive::random_normal(B * N * S * D, 2500));
  const auto k = test::cast<T>(naive::random_normal(B * Nkv * S * D, 2501));
  const auto v = test::cast<T>(naive::random_normal(B * Nkv * S * D, 2502));
  const auto dout = test::cast<T>(naive::random_normal(B * N * S * D, 2503));
  std::vector<T> o(q.size()), lse(static_cast<size_t>(B * N * S));
  cpu::sdpa_forward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), B, N, Nkv, S, S, D, scale, true);
  std::vector<T> dq1, dk1, dv1;
  test::with_threads({1, 2, 3}, [&](int threads) {
    INFO("threads " << threads);
    std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
    cpu::sdpa_backward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                          dv.data(), B, N, Nkv, S, S, D, scale, true);
    if (threads == 1) {
      dq1 = dq, dk1 = dk, dv1 = dv;
    } else {
      CHECK(dq == dq1);
      CHECK(dk == dk1);
      CHECK(dv == dv1);
    }
  });
}

TEST_CASE("sdpa_backward's workspace: its size from the chunk layout, and the kernel works in it", "[kernels][attention][backward]") {
  // B = 1, Nkv = 2: 16 tasks want 8 query chunks, capped at the 4 query blocks of 64 rows that
  // S = 200 has, so chunk c is block c. Causal, chunk c < 3 sees keys [0, 64·(c + 1)); the last
  // chunk writes dk, dv directly. Workspace: dK and dV parts of 64 + 128 + 192 rows per kv head.
  const int64_t B = 1, N = 4, Nkv = 2, S = 200, D = 16;
  CHECK(cpu::sdpa_backward_workspace(B, N, Nkv, S, S, D, true) == 2 * B * Nkv * (64 + 128 + 192) * D);
  CHECK(cpu::sdpa_backward_workspace(B, N, Nkv, S, S, D, false) == 2 * B * Nkv * 3 * S * D);  // every chunk sees all keys
  CHECK(cpu::sdpa_backward_workspace(B, N, Nkv, 64, 64, D, true) == 0);                      // one query block: one chunk
  CHECK(cpu::sdpa_backward_workspace(8, N, 2, S, S, D, true) == 0);  // B·Nkv = 16 tasks already: one chunk each
  const double scale = 0.25;
  const auto q = naive::random_normal(B * N * S * D, 2600);
  const auto k = naive::random_normal(B * Nkv * S * D, 2601);
  const auto v = naive::random_normal(B * Nkv * S * D, 2602);
  const auto dout = naive::random_normal(B * N * S * D, 2603);
  std::vector<double> o(q.size()), lse(static_cast<size_t>(B * N * S));
  cpu::sdpa_forward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), B, N, Nkv, S, S, D, scale, true);
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dq2 = dq, dk2 = dk, dv2 = dv;
  cpu::sdpa_backward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                             dv.data(), B, N, Nkv, S, S, D, scale, true);
  // A workspace full of NaN: every element the kernel reads it must have written first.
  std::vector<double> ws(static_cast<size_t>(cpu::sdpa_backward_workspace(B, N, Nkv, S, S, D, true)), std::nan(""));
  cpu::sdpa_backward<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq2.data(), dk2.data(),
                             dv2.data(), B, N, Nkv, S, S, D, scale, true, nullptr, ws.data());
  CHECK(dq2 == dq);
  CHECK(dk2 == dk);
  CHECK(dv2 == dv);
  size_t written = 0;
  for (double w : ws) written += !std::isnan(w);
  CHECK(written == ws.size());  // the chunks' partial dK, dV filled all of it
}
