// CPU adamw_step against a naive double AdamW written from the torch.optim.AdamW documentation:
// three steps (bias corrections change with the step), with and without weight decay, sizes below
// and above the parallel threshold; state (m, v) and parameters are checked after every step.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/optim.h"

using namespace autosp;

TEMPLATE_TEST_CASE("adamw_step matches the documented AdamW over three steps", "[kernels][optim]", float, double) {
  using T = TestType;
  const double lr = 0.05, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  uint32_t seed = 3400;
  for (const int64_t n : {int64_t(1), int64_t(1000), int64_t(100003)}) {
    for (const double weight_decay : {0.0, 0.1}) {
      INFO("n " << n << " weight_decay " << weight_decay);
      auto p = test::cast<T>(naive::random_normal(n, seed++));
      std::vector<T> m(size_t(n), T(0)), v(size_t(n), T(0));
      naive::Vec ref_p = test::widen(p), ref_m(size_t(n), 0.0), ref_v(size_t(n), 0.0);
      for (int64_t step = 1; step <= 3; ++step) {
        INFO("step " << step);
        // Gradients of mixed scales, so eps and the bias corrections both matter.
        const auto g = test::cast<T>(naive::random_normal(n, seed++, step == 2 ? 1e-3 : 1.0));
        cpu::adamw_step<T>(p.data(), g.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, weight_decay, step);
        naive::adamw_step(ref_p, test::widen(g), ref_m, ref_v, lr, beta1, beta2, eps, weight_decay, step);
        test::check_close(p, ref_p);
        test::check_close(m, ref_m);
        test::check_close(v, ref_v);
      }
    }
  }
}

TEST_CASE("adamw_step: the first step moves each parameter by about lr", "[kernels][optim]") {
  // Step 1 without decay: m̂ = g, v̂ = g², so the update is lr · g / (|g| + eps) ≈ lr · sign(g).
  std::vector<double> p = {1.0, 1.0, 1.0}, g = {2.0, -0.5, 1e-3}, m(3, 0.0), v(3, 0.0);
  cpu::adamw_step<double>(p.data(), g.data(), m.data(), v.data(), 3, 0.01, 0.9, 0.999, 1e-8, 0.0, 1);
  CHECK(p[0] == Approx(0.99).epsilon(1e-9));
  CHECK(p[1] == Approx(1.01).epsilon(1e-9));
  CHECK(p[2] == Approx(1.0 - 0.01 * 1e-3 / (1e-3 + 1e-8)).epsilon(1e-12));
  // Decay only: g = 0 leaves m = v = 0, so p = p · (1 - lr · wd).
  std::vector<double> q = {2.0}, zero = {0.0}, mq = {0.0}, vq = {0.0};
  cpu::adamw_step<double>(q.data(), zero.data(), mq.data(), vq.data(), 1, 0.1, 0.9, 0.999, 1e-8, 0.5, 1);
  CHECK(q[0] == Approx(2.0 * (1 - 0.05)).epsilon(1e-15));
}
