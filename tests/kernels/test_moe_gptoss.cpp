// gpt-oss's experts on the CPU MoE kernel (kernels/cpu/moe.h with kernels/kinds.h MoeOptions:
// per-expert biases and the clamped SwiGLU) against a naive float64 loop written here from
// tests/ref/gpt_oss_ref.py's `expert` and `experts` (transformers' GptOssExperts): each token, each
// of its k experts,
//   g = Wg·x + bg, u = Wu·x + bu, gc = min(g, L), uc = clamp(u, −L, L),
//   out = Wd·((uc + 1)·gc·σ(α·gc)) + bd, y += w·out,
// and its gradients by hand (torch.clamp's: 1 inside the bounds, equality included, 0 outside).
// The data make values cross the limit, and one token hits g = L, u = −L and u = +L exactly in
// each expert it goes to. E = 4, k = 2, with rows of several kMlpChunkRows chunks; forward and every
// gradient (dx, dprobs, the weights', the biases'), f64 and f32; once against float64 central
// differences of the naive forward; the gradients the same bits at any thread count. The bf16
// kernel (kernels/cpu/moe_bf16.h with the same options) against the same naive loop on bf16 values.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "bf16_test.h"
#include "common/naive.h"
#include "kernel_test.h"
#include "moe_test.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/moe_bf16.h"

namespace {

using namespace autosp;
using test::experts;
using test::experts_const;
using naive::Vec;

constexpr double kAlpha = 1.702;

struct GptOss {
  int64_t R, C, E, I, k;
  bool norm;
  double limit;
  Vec x, probs, wg, wu, wd, bg, bu, bd, dy;  // wg, wu [E, I, C], wd [E, C, I], bg, bu [E, I], bd [E, C]
  GptOss(int64_t rows, int64_t c, int64_t e, int64_t i, int64_t top, bool nrm, double lim, uint32_t seed)
      : R(rows), C(c), E(e), I(i), k(top), norm(nrm), limit(lim) {
    x = naive::random_normal(R * C, seed);
    probs = naive::softmax(naive::random_normal(R * E, seed + 1), R, E);
    wg = naive::random_normal(E * I * C, seed + 2, 0.5);
    wu = naive::random_normal(E * I * C, seed + 3, 0.5);
    wd = naive::random_normal(E * C * I, seed + 4, 0.3);
    bg = naive::random_normal(E * I, seed + 5, 0.5);
    bu = naive::random_normal(E * I, seed + 6, 0.5);
    bd = naive::random_normal(E * C, seed + 7, 0.5);
    dy = naive::random_normal(R * C, seed + 8);
  }
  // Token 0 is x = (1, 0, ..., 0), and every expert's first three units see exactly g = L, u = −L
  // and u = +L there (the products and sums are exact in binary: L a power of two).
  void plant_ties() {
    for (int64_t c = 0; c < C; ++c) x[c] = c == 0 ? 1.0 : 0.0;
    for (int64_t e = 0; e < E; ++e) {
      wg[(e * I + 0) * C] = 0.5, bg[e * I + 0] = limit - 0.5;   // g = L
      wu[(e * I + 1) * C] = 0.25, bu[e * I + 1] = -limit - 0.25;  // u = −L
      wu[(e * I + 2) * C] = 0.75, bu[e * I + 2] = limit - 0.75;   // u = +L
    }
  }
};

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

struct Naive {
  Vec y, dx, dprobs, dwg, dwu, dwd, dbg, dbu, dbd;
};

// The naive loop: the forward, and with dy the gradients of <y, dy>.
Naive naive_experts(const GptOss& m) {
  const int64_t R = m.R, C = m.C, E = m.E, I = m.I;
  const double L = m.limit;
  Naive n{Vec(size_t(R * C), 0.0), Vec(size_t(R * C), 0.0), Vec(size_t(R * E), 0.0), Vec(m.wg.size(), 0.0),
          Vec(m.wu.size(), 0.0), Vec(m.wd.size(), 0.0), Vec(m.bg.size(), 0.0), Vec(m.bu.size(), 0.0),
          Vec(m.bd.size(), 0.0)};
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<int64_t> chosen = naive::topk_experts(m.probs, r, E, m.k);
    double S = 0;
    for (int64_t e : chosen) S += m.probs[r * E + e];
    const double* xr = &m.x[size_t(r * C)];
    const double* dyr = &m.dy[size_t(r * C)];
    std::vector<double> gslot;  // dy · out for each chosen expert
    for (int64_t e : chosen) {
      const double w = m.norm ? m.probs[r * E + e] / S : m.probs[r * E + e];
      std::vector<double> g(static_cast<size_t>(I)), u(g.size()), h(g.size()), out(static_cast<size_t>(C));
      for (int64_t i = 0; i < I; ++i) {
        g[i] = m.bg[e * I + i], u[i] = m.bu[e * I + i];
        for (int64_t c = 0; c < C; ++c) {
          g[i] += m.wg[(e * I + i) * C + c] * xr[c];
          u[i] += m.wu[(e * I + i) * C + c] * xr[c];
        }
        const double gc = std::min(g[i], L), uc = std::max(-L, std::min(u[i], L));
        h[i] = (uc + 1) * gc * sigmoid(kAlpha * gc);
      }
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        out[c] = m.bd[e * C + c];
        for (int64_t i = 0; i < I; ++i) out[c] += m.wd[(e * C + c) * I + i] * h[i];
        n.y[r * C + c] += w * out[c];
        dot += dyr[c] * out[c];
      }
      gslot.push_back(dot);
      // backward of w·out: dout = w·dy
      std::vector<double> dh(size_t(I), 0.0);
      for (int64_t c = 0; c < C; ++c) {
        const double dout = w * dyr[c];
        n.dbd[e * C + c] += dout;
        for (int64_t i = 0; i < I; ++i) {
          n.dwd[(e * C + c) * I + i] += dout * h[i];
          dh[i] += m.wd[(e * C + c) * I + i] * dout;
        }
      }
      for (int64_t i = 0; i < I; ++i) {
        const double gc = std::min(g[i], L), uc = std::max(-L, std::min(u[i], L)), s = sigmoid(kAlpha * gc);
        // d/dgc of gc·σ(α·gc) = σ + α·gc·σ·(1 − σ)
        const double dgc = dh[i] * (uc + 1) * (s + kAlpha * gc * s * (1 - s));
        const double duc = dh[i] * gc * s;
        const double dg = g[i] <= L ? dgc : 0.0;                 // clamp(max = L): 1 where g ≤ L
        const double du = (u[i] >= -L && u[i] <= L) ? duc : 0.0;  // clamp(−L, L): 1 inside, bounds included
        n.dbg[e * I + i] += dg, n.dbu[e * I + i] += du;
        for (int64_t c = 0; c < C; ++c) {
          n.dwg[(e * I + i) * C + c] += dg * xr[c];
          n.dwu[(e * I + i) * C + c] += du * xr[c];
          n.dx[r * C + c] += dg * m.wg[(e * I + i) * C + c] + du * m.wu[(e * I + i) * C + c];
        }
      }
    }
    // dprobs: w_j = p_j / S (norm) or p_j; ∂w_j/∂p_i = (δ_ij·S − p_j) / S² for chosen i, j.
    for (size_t a = 0; a < chosen.size(); ++a) {
      const int64_t i = chosen[a];
      double d = 0;
      for (size_t b = 0; b < chosen.size(); ++b) {
        const double pj = m.probs[r * E + chosen[b]];
        const double dw = m.norm ? ((a == b ? S : 0.0) - pj) / (S * S) : (a == b ? 1.0 : 0.0);
        d += gslot[b] * dw;
      }
      n.dprobs[r * E + i] = d;
    }
  }
  return n;
}

template <class T>
struct Kernel {
  std::vector<T> y, dx, dp, dwg, dwu, dwd, dbg, dbu, dbd;
};

// The kernel's forward and backward in T on m's data; with `keep`, the backward from the forward's
// kept gate and up block (moe.h) instead of recomputing them.
template <class T>
Kernel<T> run_kernel(const GptOss& m, bool keep = false) {
  auto x = test::cast<T>(m.x), p = test::cast<T>(m.probs), dy = test::cast<T>(m.dy);
  auto wg = test::cast<T>(m.wg), wu = test::cast<T>(m.wu), wd = test::cast<T>(m.wd);
  auto bg = test::cast<T>(m.bg), bu = test::cast<T>(m.bu), bd = test::cast<T>(m.bd);
  const auto g = experts_const(wg, m.E), u = experts_const(wu, m.E), d = experts_const(wd, m.E);
  const auto cbg = experts_const(bg, m.E), cbu = experts_const(bu, m.E), cbd = experts_const(bd, m.E);
  Kernel<T> k{std::vector<T>(m.x.size()), std::vector<T>(m.x.size()), std::vector<T>(m.probs.size()),
              std::vector<T>(m.wg.size()), std::vector<T>(m.wu.size()), std::vector<T>(m.wd.size()),
              std::vector<T>(m.bg.size()), std::vector<T>(m.bu.size()), std::vector<T>(m.bd.size())};
  const auto dbg = experts(k.dbg, m.E), dbu = experts(k.dbu, m.E), dbd = experts(k.dbd, m.E);
  kernels::MoeOptions<T> opt{.b_gate = cbg.data(), .b_up = cbu.data(), .b_down = cbd.data(), .db_gate = dbg.data(),
                             .db_up = dbu.data(), .db_down = dbd.data(), .clamped = true, .alpha = kAlpha,
                             .limit = m.limit};
  std::vector<T> kept(keep ? size_t(2 * m.R * m.k * m.I) : 0);
  T* kp = keep ? kept.data() : nullptr;
  if (keep) {
    cpu::moe_experts_forward_keeping<T>(x.data(), p.data(), g.data(), u.data(), d.data(), k.y.data(), m.R, m.C, m.E,
                                        m.I, m.k, m.norm, opt, kp);
    cpu::moe_experts_backward_from_kept<T>(dy.data(), x.data(), p.data(), g.data(), u.data(), d.data(), k.dx.data(),
                                           k.dp.data(), experts(k.dwg, m.E).data(), experts(k.dwu, m.E).data(),
                                           experts(k.dwd, m.E).data(), m.R, m.C, m.E, m.I, m.k, m.norm, opt, kp);
    return k;
  }
  cpu::moe_experts_forward<T>(x.data(), p.data(), g.data(), u.data(), d.data(), k.y.data(), m.R, m.C, m.E, m.I, m.k,
                              m.norm, opt);
  cpu::moe_experts_backward<T>(dy.data(), x.data(), p.data(), g.data(), u.data(), d.data(), k.dx.data(), k.dp.data(),
                               experts(k.dwg, m.E).data(), experts(k.dwu, m.E).data(), experts(k.dwd, m.E).data(),
                               m.R, m.C, m.E, m.I, m.k, m.norm, opt);
  return k;
}

// The data as T sees it, widened back (so the reference starts from the same values).
template <class T>
void round_to(GptOss& m) {
  for (Vec* v : {&m.x, &m.probs, &m.wg, &m.wu, &m.wd, &m.bg, &m.bu, &m.bd, &m.dy}) *v = test::widen(test::cast<T>(*v));
}

template <class T>
void check_against_naive(const GptOss& m, double tol) {
  const Naive n = naive_experts(m);
  const Kernel<T> k = run_kernel<T>(m);
  struct Pair {
    const char* name;
    const std::vector<T>& got;
    const Vec& want;
  };
  for (const Pair& p : {Pair{"y", k.y, n.y}, Pair{"dx", k.dx, n.dx}, Pair{"dprobs", k.dp, n.dprobs},
                        Pair{"dw_gate", k.dwg, n.dwg}, Pair{"dw_up", k.dwu, n.dwu}, Pair{"dw_down", k.dwd, n.dwd},
                        Pair{"db_gate", k.dbg, n.dbg}, Pair{"db_up", k.dbu, n.dbu}, Pair{"db_down", k.dbd, n.dbd}}) {
    INFO(p.name);
    test::check_close(p.got, p.want, tol);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("gpt-oss experts (biases, clamped SwiGLU) match the naive float64 loop, ties at the limit included",
                   "[kernels][moe][gpt-oss]", float, double) {
  using T = TestType;
  // limit 1: many projections cross it (their spread is about 1.5), so both sides of each clamp
  // are exercised; 2600 rows over 4 experts at k = 2 give each expert more than one chunk of 1024.
  for (const bool norm : {true, false}) {
    INFO("norm_topk_prob " << norm);
    GptOss m(2600, 8, 4, 6, 2, norm, 1.0, 300);
    m.plant_ties();
    round_to<T>(m);
    check_against_naive<T>(m, sizeof(T) == 4 ? 2e-4 : 1e-10);
  }
}

TEST_CASE("gpt-oss experts cross the limit and hit it exactly in these data", "[kernels][moe][gpt-oss]") {
  // What the test above relies on: some projections beyond ±L on both sides, and the planted ties.
  GptOss m(2600, 8, 4, 6, 2, true, 1.0, 300);
  m.plant_ties();
  int64_t above = 0, below = 0, ties = 0;
  for (int64_t r = 0; r < m.R; ++r)
    for (int64_t e = 0; e < m.E; ++e)
      for (int64_t i = 0; i < m.I; ++i) {
        double g = m.bg[e * m.I + i], u = m.bu[e * m.I + i];
        for (int64_t c = 0; c < m.C; ++c) {
          g += m.wg[(e * m.I + i) * m.C + c] * m.x[r * m.C + c];
          u += m.wu[(e * m.I + i) * m.C + c] * m.x[r * m.C + c];
        }
        above += g > m.limit, below += u < -m.limit;
        ties += (g == m.limit) + (u == -m.limit) + (u == m.limit);
      }
  CHECK(above > 1000);
  CHECK(below > 1000);
  CHECK(ties >= 3 * m.E);
}

TEST_CASE("gpt-oss experts' backward is the gradient of the naive loop (float64 central differences)",
          "[kernels][moe][gpt-oss]") {
  // No planted ties (a central difference across a clamp's kink measures neither side).
  GptOss m(40, 6, 4, 7, 2, true, 1.0, 400);
  const Kernel<double> k = run_kernel<double>(m);
  auto loss = [&] { return test::dot(naive_experts(m).y, m.dy); };
  uint32_t seed = 500;
  auto direction = [&](size_t n) { return naive::random_normal(static_cast<int64_t>(n), seed++); };
  test::check_directional(m.x, direction(m.x.size()), test::widen(k.dx), loss);
  test::check_directional(m.probs, direction(m.probs.size()), test::widen(k.dp), loss);
  test::check_directional(m.wg, direction(m.wg.size()), test::widen(k.dwg), loss);
  test::check_directional(m.wu, direction(m.wu.size()), test::widen(k.dwu), loss);
  test::check_directional(m.wd, direction(m.wd.size()), test::widen(k.dwd), loss);
  test::check_directional(m.bg, direction(m.bg.size()), test::widen(k.dbg), loss);
  test::check_directional(m.bu, direction(m.bu.size()), test::widen(k.dbu), loss);
  test::check_directional(m.bd, direction(m.bd.size()), test::widen(k.dbd), loss);
}

TEST_CASE("gpt-oss experts' gradients are the same bits at any thread count", "[kernels][moe][gpt-oss]") {
  GptOss m(1500, 32, 4, 40, 2, true, 1.0, 600);
  Kernel<float> first;
  test::with_threads({1, 2, 3}, [&](int t) {
    INFO("threads " << t);
    Kernel<float> k = run_kernel<float>(m);
    if (t == 1) {
      first = std::move(k);
      return;
    }
    CHECK(k.y == first.y);
    CHECK(k.dx == first.dx);
    CHECK(k.dp == first.dp);
    CHECK(k.dwg == first.dwg);
    CHECK(k.dbg == first.dbg);
    CHECK(k.dbu == first.dbu);
    CHECK(k.dbd == first.dbd);
  });
}

TEST_CASE("gpt-oss experts' backward from the kept gate and up block is the same bits as recomputing",
          "[kernels][moe][gpt-oss]") {
  // The kept projections include the biases; the clamped activation's backward reads them as it
  // reads the recomputed ones. At 2 threads the 4 experts run side by side.
  GptOss m(1500, 32, 4, 40, 2, true, 1.0, 610);
  test::with_threads({1, 2}, [&](int t) {
    INFO("threads " << t);
    const Kernel<float> a = run_kernel<float>(m), b = run_kernel<float>(m, true);
    CHECK(b.y == a.y);
    CHECK(b.dx == a.dx);
    CHECK(b.dp == a.dp);
    CHECK(b.dwg == a.dwg);
    CHECK(b.dwu == a.dwu);
    CHECK(b.dwd == a.dwd);
    CHECK(b.dbg == a.dbg);
    CHECK(b.dbu == a.dbu);
    CHECK(b.dbd == a.dbd);
  });
}

// The bf16 kernel (kernels/cpu/moe_bf16.h) with gpt-oss's options on every bf16 GEMM path this CPU
// has: the data rounded to bf16, and every output (y, dx, dprobs, the weights' and the biases'
// gradients) against the naive float64 loop on those values within the bf16 MoE kernel's relative
// L2 bound (test_moe_bf16.cpp's). Every output buffer starts as NaN, so each must be written.
TEST_CASE("gpt-oss experts on bf16 match the naive float64 loop within bf16 rounding",
          "[kernels][moe][gpt-oss][bf16]") {
  struct Shape {
    int64_t R, C, E, I;
    bool norm, ties;
  };
  // The first: rows of several chunks per expert and the planted ties (exact in bf16 too); the
  // others wider rows (the GEMMs' tiles), limit 1 crossed both ways.
  for (const Shape& sh : {Shape{2600, 8, 4, 6, true, true}, Shape{96, 32, 4, 40, false, false},
                          Shape{80, 48, 4, 24, true, false}}) {
    GptOss m(sh.R, sh.C, sh.E, sh.I, 2, sh.norm, 1.0, 700);
    if (sh.ties) m.plant_ties();
    for (Vec* v : {&m.x, &m.probs, &m.wg, &m.wu, &m.wd, &m.bg, &m.bu, &m.bd, &m.dy})
      *v = test::widen_bf16(test::to_bf16(*v));
    const Naive n = naive_experts(m);
    auto x = test::to_bf16(m.x), p = test::to_bf16(m.probs), dy = test::to_bf16(m.dy);
    auto wg = test::to_bf16(m.wg), wu = test::to_bf16(m.wu), wd = test::to_bf16(m.wd);
    auto bg = test::to_bf16(m.bg), bu = test::to_bf16(m.bu), bd = test::to_bf16(m.bd);
    const auto g = experts_const(wg, m.E), u = experts_const(wu, m.E), d = experts_const(wd, m.E);
    const auto cbg = experts_const(bg, m.E), cbu = experts_const(bu, m.E), cbd = experts_const(bd, m.E);
    test::for_each_bf16_path([&](cpu::Bf16Gemm path) {
      INFO("R " << m.R << " C " << m.C << " I " << m.I << " norm " << m.norm);
      const uint16_t nan = 0x7fc0;
      std::vector<uint16_t> y(x.size(), nan), dx(x.size(), nan), dp(p.size(), nan), dwg(wg.size(), nan),
          dwu(wu.size(), nan), dwd(wd.size(), nan), dbg(bg.size(), nan), dbu(bu.size(), nan), dbd(bd.size(), nan);
      const auto pdbg = experts(dbg, m.E), pdbu = experts(dbu, m.E), pdbd = experts(dbd, m.E);
      const kernels::MoeOptions<uint16_t> opt{.b_gate = cbg.data(), .b_up = cbu.data(), .b_down = cbd.data(),
                                              .db_gate = pdbg.data(), .db_up = pdbu.data(), .db_down = pdbd.data(),
                                              .clamped = true, .alpha = kAlpha, .limit = m.limit};
      cpu::moe_experts_forward_bf16(path, x.data(), p.data(), g.data(), u.data(), d.data(), y.data(), m.R, m.C, m.E,
                                    m.I, m.k, m.norm, opt);
      cpu::moe_experts_backward_bf16(path, dy.data(), x.data(), p.data(), g.data(), u.data(), d.data(), dx.data(),
                                     dp.data(), experts(dwg, m.E).data(), experts(dwu, m.E).data(),
                                     experts(dwd, m.E).data(), m.R, m.C, m.E, m.I, m.k, m.norm, opt);
      struct Pair {
        const char* name;
        const std::vector<uint16_t>& got;
        const Vec& want;
      };
      for (const Pair& q : {Pair{"y", y, n.y}, Pair{"dx", dx, n.dx}, Pair{"dprobs", dp, n.dprobs},
                            Pair{"dw_gate", dwg, n.dwg}, Pair{"dw_up", dwu, n.dwu}, Pair{"dw_down", dwd, n.dwd},
                            Pair{"db_gate", dbg, n.dbg}, Pair{"db_up", dbu, n.dbu}, Pair{"db_down", dbd, n.dbd}}) {
        const double e = test::relative_l2(test::widen_bf16(q.got), q.want);
        INFO(q.name << ": relative L2 error " << e);
        CHECK(e <= 5e-3);
      }
    });
  }
}
