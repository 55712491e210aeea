// CPU tiled SwiGLU MLP (kernels/cpu/mlp.h) against the naive double loops of tests/common/naive.h,
// over more rows than one chunk (2.5 · kMlpChunkRows, so a partial last chunk and weight gradients
// accumulated over three chunks), forward and all four gradients; a small explicit chunk size over
// an odd row count; the gradient against central differences of the forward kernel; and the
// weight gradients bitwise across thread counts. The bf16 versions against the same loops.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/bf16_test.h"
#include "kernels/cpu/mlp.h"

namespace {

using namespace autosp;

struct Mlp {
  int64_t R, C, I;
  naive::Vec x, wg, wu, wd, dy;
  Mlp(int64_t rows, int64_t c, int64_t i, uint32_t seed) : R(rows), C(c), I(i) {
    x = naive::random_normal(R * C, seed);
    wg = naive::random_normal(I * C, seed + 1, 0.3);
    wu = naive::random_normal(I * C, seed + 2, 0.3);
    wd = naive::random_normal(C * I, seed + 3, 0.3);
    dy = naive::random_normal(R * C, seed + 4);
  }
};

template <class T>
struct Grads {
  std::vector<T> dx, dwg, dwu, dwd;
};

template <class T>
Grads<T> backward(const Mlp& m, int64_t chunk) {
  Grads<T> g{std::vector<T>(m.x.size()), std::vector<T>(m.wg.size()), std::vector<T>(m.wu.size()),
             std::vector<T>(m.wd.size())};
  const auto dy = test::cast<T>(m.dy), x = test::cast<T>(m.x);
  const auto wg = test::cast<T>(m.wg), wu = test::cast<T>(m.wu), wd = test::cast<T>(m.wd);
  cpu::swiglu_mlp_backward<T>(dy.data(), x.data(), wg.data(), wu.data(), wd.data(), g.dx.data(), g.dwg.data(),
                              g.dwu.data(), g.dwd.data(), m.R, m.C, m.I, chunk);
  return g;
}

template <class T>
std::vector<T> forward(const Mlp& m, int64_t chunk) {
  std::vector<T> y(m.x.size());
  const auto x = test::cast<T>(m.x), wg = test::cast<T>(m.wg), wu = test::cast<T>(m.wu), wd = test::cast<T>(m.wd);
  cpu::swiglu_mlp_forward<T>(x.data(), wg.data(), wu.data(), wd.data(), y.data(), m.R, m.C, m.I, chunk);
  return y;
}

// Forward and the four gradients against the naive loops (on the values as T sees them).
template <class T>
void check_against_naive(const Mlp& m0, int64_t chunk, double tolerance) {
  Mlp m = m0;
  for (naive::Vec* v : {&m.x, &m.wg, &m.wu, &m.wd, &m.dy}) *v = test::widen(test::cast<T>(*v));
  test::check_close(forward<T>(m, chunk), naive::swiglu_mlp(m.x, m.wg, m.wu, m.wd, m.R, m.C, m.I), tolerance);
  naive::Vec dx, dwg, dwu, dwd;
  naive::swiglu_mlp_backward(m.dy, m.x, m.wg, m.wu, m.wd, m.R, m.C, m.I, dx, dwg, dwu, dwd);
  const Grads<T> g = backward<T>(m, chunk);
  {
    INFO("dx");
    test::check_close(g.dx, dx, tolerance);
  }
  {
    INFO("dw_gate");
    test::check_close(g.dwg, dwg, tolerance);
  }
  {
    INFO("dw_up");
    test::check_close(g.dwu, dwu, tolerance);
  }
  {
    INFO("dw_down");
    test::check_close(g.dwd, dwd, tolerance);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("swiglu_mlp over 2.5 chunks of rows matches the naive MLP, forward and gradients",
                   "[kernels][mlp]", float, double) {
  using T = TestType;
  static_assert(cpu::kMlpChunkRows >= 2);
  const Mlp m(cpu::kMlpChunkRows * 5 / 2, 24, 40, 31);
  // Weight gradients sum 2.5k rows of O(1) terms: f32 rounding grows with that count.
  check_against_naive<T>(m, cpu::kMlpChunkRows, sizeof(T) == 4 ? 1e-4 : 1e-11);
}

TEMPLATE_TEST_CASE("swiglu_mlp with a small chunk over an odd row count matches the naive MLP", "[kernels][mlp]",
                   float, double) {
  using T = TestType;
  for (const int64_t chunk : {1, 4, 11, 64}) {
    INFO("rows 11, chunk " << chunk);
    check_against_naive<T>(Mlp(11, 5, 7, 40), chunk, test::tol<T>());
  }
}

TEST_CASE("swiglu_mlp_backward is the gradient of swiglu_mlp_forward (central differences)", "[kernels][mlp]") {
  Mlp m(9, 6, 10, 50);
  const naive::Vec r = naive::random_normal(m.R * m.C, 60);  // loss = <y, r>
  m.dy = r;
  const Grads<double> g = backward<double>(m, 4);
  auto loss = [&] { return test::dot(test::widen(forward<double>(m, 4)), r); };
  uint32_t seed = 70;
  auto direction = [&](size_t n) { return naive::random_normal(static_cast<int64_t>(n), seed++); };
  test::check_directional(m.x, direction(m.x.size()), test::widen(g.dx), loss);
  test::check_directional(m.wg, direction(m.wg.size()), test::widen(g.dwg), loss);
  test::check_directional(m.wu, direction(m.wu.size()), test::widen(g.dwu), loss);
  test::check_directional(m.wd, direction(m.wd.size()), test::widen(g.dwd), loss);
}

TEST_CASE("swiglu_mlp's gradients are the same bits at any thread count", "[kernels][mlp]") {
  const Mlp m(cpu::kMlpChunkRows * 5 / 2, 64, 96, 80);
  Grads<float> first;
  test::with_threads({1, 2, 3}, [&](int t) {
    INFO("threads " << t);
    Grads<float> g = backward<float>(m, cpu::kMlpChunkRows);
    if (t == 1) {
      first = std::move(g);
      return;
    }
    CHECK(g.dx == first.dx);
    CHECK(g.dwg == first.dwg);
    CHECK(g.dwu == first.dwu);
    CHECK(g.dwd == first.dwd);
  });
}

// The bf16 versions against the naive loops on the same bf16 values, within the CUDA MLP tests'
// bf16 bound (relative L2 error 5e-3, tests/cuda/emulate_mlp.cpp): h, dg and du are rounded to
// bf16 between the GEMMs (as there), every output once. On each bf16 GEMM path the CPU has (a path
// it lacks says SKIPPED).
TEST_CASE("swiglu_mlp on bf16 matches the naive MLP within bf16 tolerance", "[kernels][mlp][bf16]") {
  test::for_each_bf16_path([](cpu::Bf16Gemm path) {
    for (const int64_t chunk : {int64_t(7), cpu::kMlpChunkRows}) {
      INFO("chunk " << chunk);
      Mlp m(chunk == 7 ? 19 : cpu::kMlpChunkRows * 5 / 2, 24, 40, 90);
      const auto x = test::to_bf16(m.x), wg = test::to_bf16(m.wg), wu = test::to_bf16(m.wu), wd = test::to_bf16(m.wd),
                 dy = test::to_bf16(m.dy);
      for (auto [v, b] : {std::pair{&m.x, &x}, {&m.wg, &wg}, {&m.wu, &wu}, {&m.wd, &wd}, {&m.dy, &dy}})
        *v = test::widen_bf16(*b);  // the values the kernels see
      std::vector<uint16_t> y(x.size()), dx(x.size()), dwg(wg.size()), dwu(wu.size()), dwd(wd.size());
      cpu::swiglu_mlp_forward_bf16(path, x.data(), wg.data(), wu.data(), wd.data(), y.data(), m.R, m.C, m.I, chunk);
      cpu::swiglu_mlp_backward_bf16(path, dy.data(), x.data(), wg.data(), wu.data(), wd.data(), dx.data(), dwg.data(),
                                    dwu.data(), dwd.data(), m.R, m.C, m.I, chunk);
      naive::Vec rdx, rdwg, rdwu, rdwd;
      naive::swiglu_mlp_backward(m.dy, m.x, m.wg, m.wu, m.wd, m.R, m.C, m.I, rdx, rdwg, rdwu, rdwd);
      const double e_y =
          test::relative_l2(test::widen_bf16(y), naive::swiglu_mlp(m.x, m.wg, m.wu, m.wd, m.R, m.C, m.I));
      const double e_dx = test::relative_l2(test::widen_bf16(dx), rdx);
      const double e_dwg = test::relative_l2(test::widen_bf16(dwg), rdwg);
      const double e_dwu = test::relative_l2(test::widen_bf16(dwu), rdwu);
      const double e_dwd = test::relative_l2(test::widen_bf16(dwd), rdwd);
      INFO("relative L2 error of y " << e_y << ", dx " << e_dx << ", dWg " << e_dwg << ", dWu " << e_dwu << ", dWd "
                                     << e_dwd);
      CHECK(std::max({e_y, e_dx, e_dwg, e_dwu, e_dwd}) <= 5e-3);
    }
  });
}
