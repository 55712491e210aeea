// CPU grouped expert MLP (kernels/cpu/moe.h) against a naive per-token loop (tests/common/naive.h
// moe_experts: each token's top-k and one SwiGLU MLP per chosen expert), with softmax router
// probabilities and an expert that no token chooses; its backward against float64 central
// differences of that naive loop (not of the kernel), for Mixtral's renormalised weights and
// Qwen's raw ones; the gradients bitwise across thread counts; the forward's kept gate and up
// block against float64 projections, and the backward from it the same bits as recomputing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "moe_test.h"
#include "kernels/cpu/moe.h"

namespace {

using namespace autosp;
using test::experts;

struct Moe {
  int64_t R, C, E, I, k;
  bool norm;
  naive::Vec x, probs, wg, wu, wd, dy;
  Moe(int64_t rows, int64_t c, int64_t e, int64_t i, int64_t top, bool nrm, uint32_t seed)
      : R(rows), C(c), E(e), I(i), k(top), norm(nrm) {
    x = naive::random_normal(R * C, seed);
    naive::Vec logits = naive::random_normal(R * E, seed + 1);
    for (int64_t r = 0; r < R; ++r) logits[r * E + E - 1] = -30;  // the last expert gets no token
    probs = naive::softmax(logits, R, E);
    wg = naive::random_normal(E * I * C, seed + 2, 0.3);
    wu = naive::random_normal(E * I * C, seed + 3, 0.3);
    wd = naive::random_normal(E * C * I, seed + 4, 0.3);
    dy = naive::random_normal(R * C, seed + 5);
  }
  naive::Vec reference() const { return naive::moe_experts(x, probs, wg, wu, wd, R, C, E, I, k, norm); }
};

template <class T>
std::vector<T> forward(const Moe& m, T* kept = nullptr) {
  std::vector<T> y(m.x.size());
  const auto x = test::cast<T>(m.x), p = test::cast<T>(m.probs);
  auto wg = test::cast<T>(m.wg), wu = test::cast<T>(m.wu), wd = test::cast<T>(m.wd);
  const auto g = experts(wg, m.E), u = experts(wu, m.E), d = experts(wd, m.E);
  const std::vector<const T*> gc(g.begin(), g.end()), uc(u.begin(), u.end()), dc(d.begin(), d.end());
  if (kept)
    cpu::moe_experts_forward_keeping<T>(x.data(), p.data(), gc.data(), uc.data(), dc.data(), y.data(), m.R, m.C, m.E,
                                        m.I, m.k, m.norm, {}, kept);
  else
    cpu::moe_experts_forward<T>(x.data(), p.data(), gc.data(), uc.data(), dc.data(), y.data(), m.R, m.C, m.E, m.I, m.k,
                                m.norm);
  return y;
}

template <class T>
struct Grads {
  std::vector<T> dx, dp, dwg, dwu, dwd;
};

template <class T>
Grads<T> backward(const Moe& m, T* kept = nullptr) {
  Grads<T> g{std::vector<T>(m.x.size()), std::vector<T>(m.probs.size()), std::vector<T>(m.wg.size()),
             std::vector<T>(m.wu.size()), std::vector<T>(m.wd.size())};
  const auto dy = test::cast<T>(m.dy), x = test::cast<T>(m.x), p = test::cast<T>(m.probs);
  auto wg = test::cast<T>(m.wg), wu = test::cast<T>(m.wu), wd = test::cast<T>(m.wd);
  const auto eg = experts(wg, m.E), eu = experts(wu, m.E), ed = experts(wd, m.E);
  const std::vector<const T*> gc(eg.begin(), eg.end()), uc(eu.begin(), eu.end()), dc(ed.begin(), ed.end());
  if (kept)
    cpu::moe_experts_backward_from_kept<T>(dy.data(), x.data(), p.data(), gc.data(), uc.data(), dc.data(), g.dx.data(),
                                           g.dp.data(), experts(g.dwg, m.E).data(), experts(g.dwu, m.E).data(),
                                           experts(g.dwd, m.E).data(), m.R, m.C, m.E, m.I, m.k, m.norm, {}, kept);
  else
    cpu::moe_experts_backward<T>(dy.data(), x.data(), p.data(), gc.data(), uc.data(), dc.data(), g.dx.data(),
                                 g.dp.data(), experts(g.dwg, m.E).data(), experts(g.dwu, m.E).data(),
                                 experts(g.dwd, m.E).data(), m.R, m.C, m.E, m.I, m.k, m.norm);
  return g;
}

}  // namespace

TEMPLATE_TEST_CASE("moe_experts matches a naive per-token loop", "[kernels][moe]", float, double) {
  using T = TestType;
  for (const bool norm : {true, false}) {
    for (const int64_t k : {1, 2, 3}) {
      INFO("norm_topk_prob " << norm << ", top_k " << k);
      Moe m(37, 8, 6, 12, k, norm, 11);
      for (naive::Vec* v : {&m.x, &m.probs, &m.wg, &m.wu, &m.wd}) *v = test::widen(test::cast<T>(*v));
      test::check_close(forward<T>(m), m.reference(), sizeof(T) == 4 ? 2e-5 : 1e-12);
    }
  }
}

TEST_CASE("moe_experts_backward is the gradient of the naive loop (float64 central differences)", "[kernels][moe]") {
  for (const bool norm : {true, false}) {
    INFO("norm_topk_prob " << norm);
    Moe m(23, 6, 5, 7, 2, norm, 21);
    const naive::Vec r = naive::random_normal(m.R * m.C, 30);  // loss = <y, r>
    m.dy = r;
    const Grads<double> g = backward<double>(m);
    auto loss = [&] { return test::dot(m.reference(), r); };
    uint32_t seed = 40;
    auto direction = [&](size_t n) { return naive::random_normal(static_cast<int64_t>(n), seed++); };
    test::check_directional(m.x, direction(m.x.size()), test::widen(g.dx), loss);
    test::check_directional(m.probs, direction(m.probs.size()), test::widen(g.dp), loss);
    test::check_directional(m.wg, direction(m.wg.size()), test::widen(g.dwg), loss);
    test::check_directional(m.wu, direction(m.wu.size()), test::widen(g.dwu), loss);
    test::check_directional(m.wd, direction(m.wd.size()), test::widen(g.dwd), loss);
    // The expert no token chose has zero weight gradients (overwritten, not left as they were).
    const int64_t e = m.E - 1;
    for (int64_t i = e * m.I * m.C; i < (e + 1) * m.I * m.C; ++i) REQUIRE(g.dwg[i] == 0.0);
  }
}

TEST_CASE("moe_experts' output and gradients are the same bits at any thread count", "[kernels][moe]") {
  // At 1 thread the experts run one after another; at 2 and 3 (7 experts with rows: at least two
  // per thread) side by side, one thread per expert, their rows summed per token at the end (top 3:
  // the order of a row's three terms shows). The second case runs two chunks of kMlpChunkRows per
  // expert side by side.
  struct Case {
    int64_t R, C, E, I, k;
  };
  for (const Case s : {Case{600, 32, 8, 40, 3}, Case{4000, 4, 5, 5, 2}}) {
    INFO("R " << s.R << " E " << s.E << " top_k " << s.k);
    const Moe m(s.R, s.C, s.E, s.I, s.k, true, 50);
    std::vector<float> y1;
    Grads<float> first;
    test::with_threads({1, 2, 3}, [&](int t) {
      INFO("threads " << t);
      std::vector<float> y = forward<float>(m);
      Grads<float> g = backward<float>(m);
      if (t == 1) {
        test::check_close(y, m.reference(), 1e-4);  // within f32 rounding of the float64 naive loop
        y1 = std::move(y), first = std::move(g);
        return;
      }
      CHECK(y == y1);
      CHECK(g.dx == first.dx);
      CHECK(g.dp == first.dp);
      CHECK(g.dwg == first.dwg);
      CHECK(g.dwu == first.dwu);
      CHECK(g.dwd == first.dwd);
    });
  }
}

TEST_CASE("moe_experts in float (the 16-lane activation) and over several chunks of an expert's rows",
          "[kernels][moe]") {
  // I = 37: two full 16-lane vectors and a tail; an expert with 2100 rows runs three chunks of
  // kMlpChunkRows = 1024, its weight gradients summed over them.
  struct Case {
    int64_t R, C, E, I;
  };
  for (const Case s : {Case{41, 8, 4, 37}, Case{2100, 4, 2, 5}}) {
    INFO("R " << s.R << " I " << s.I);
    Moe m(s.R, s.C, s.E, s.I, 2, true, 60);
    for (naive::Vec* v : {&m.x, &m.probs, &m.wg, &m.wu, &m.wd, &m.dy}) *v = test::widen(test::cast<float>(*v));
    test::check_close(forward<float>(m), m.reference(), 2e-5);
    const Grads<float> g = backward<float>(m);
    const Grads<double> g64 = backward<double>(m);
    const naive::Vec r = m.dy;
    auto loss = [&] { return test::dot(m.reference(), r); };
    uint32_t seed = 70;
    auto direction = [&](size_t n) { return naive::random_normal(static_cast<int64_t>(n), seed++); };
    // float gradients: within f32 rounding of the central differences (float64, of the naive loop)
    test::check_directional(m.x, direction(m.x.size()), test::widen(g.dx), loss, 1e-4);
    test::check_directional(m.probs, direction(m.probs.size()), test::widen(g.dp), loss, 1e-4);
    test::check_directional(m.wg, direction(m.wg.size()), test::widen(g.dwg), loss, 1e-4);
    test::check_directional(m.wu, direction(m.wu.size()), test::widen(g.dwu), loss, 1e-4);
    test::check_directional(m.wd, direction(m.wd.size()), test::widen(g.dwd), loss, 1e-4);
    test::check_directional(m.wd, direction(m.wd.size()), test::widen(g64.dwd), loss);
    test::check_directional(m.wg, direction(m.wg.size()), test::widen(g64.dwg), loss);
  }
}

TEST_CASE("moe_experts' kept gate and up block: each assignment's projections, and the backward's same bits",
          "[kernels][moe]") {
  // kept [2, R·k, I]: place p runs expert after expert, each expert's rows in row order (the
  // routing's grouping), written here from the naive top-k, not from kernels/moe_routing.h. The
  // second case has experts of more than one chunk (kMlpChunkRows = 1024 rows), so the kept rows of
  // a later chunk are at their offset. At 2 threads the first runs side by side (7 experts with
  // rows), the second one expert after another (2 with rows).
  struct Case {
    int64_t R, C, E, I, k;
  };
  for (const Case s : {Case{600, 32, 8, 40, 3}, Case{2100, 4, 3, 5, 2}}) {
    INFO("R " << s.R << " E " << s.E << " top_k " << s.k);
    Moe m(s.R, s.C, s.E, s.I, s.k, true, 80);
    for (naive::Vec* v : {&m.x, &m.probs, &m.wg, &m.wu, &m.wd, &m.dy}) *v = test::widen(test::cast<float>(*v));
    const int64_t slots = m.R * m.k;
    // The expected block, in float64.
    naive::Vec want(size_t(2 * slots * m.I));
    int64_t p = 0;
    for (int64_t e = 0; e < m.E; ++e)
      for (int64_t r = 0; r < m.R; ++r) {
        const std::vector<int64_t> chosen = naive::topk_experts(m.probs, r, m.E, m.k);
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) continue;
        for (int64_t i = 0; i < m.I; ++i) {
          double g = 0, u = 0;
          for (int64_t c = 0; c < m.C; ++c) {
            g += m.wg[size_t((e * m.I + i) * m.C + c)] * m.x[size_t(r * m.C + c)];
            u += m.wu[size_t((e * m.I + i) * m.C + c)] * m.x[size_t(r * m.C + c)];
          }
          want[size_t(p * m.I + i)] = g, want[size_t((slots + p) * m.I + i)] = u;
        }
        ++p;
      }
    REQUIRE(p == slots);
    test::with_threads({1, 2}, [&](int t) {
      INFO("threads " << t);
      const std::vector<float> y = forward<float>(m);
      const Grads<float> g = backward<float>(m);
      std::vector<float> kept(size_t(2 * slots * m.I), std::nanf(""));
      CHECK(forward<float>(m, kept.data()) == y);
      test::check_close(kept, want, 1e-5);
      const Grads<float> from_kept = backward<float>(m, kept.data());
      CHECK(from_kept.dx == g.dx);
      CHECK(from_kept.dp == g.dp);
      CHECK(from_kept.dwg == g.dwg);
      CHECK(from_kept.dwu == g.dwu);
      CHECK(from_kept.dwd == g.dwd);
    });
  }
}
