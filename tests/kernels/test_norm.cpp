// CPU layernorm, RMSNorm and softmax against naive double references over odd shapes, including
// inputs with a large common offset (catches one-pass variance) and large logits (catches a
// softmax without the max shift).
#include <catch2/catch.hpp>

#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/norm.h"

namespace {

using namespace autosp;

struct RowsC {
  int64_t rows, C;
};
const RowsC kNormShapes[] = {{1, 1}, {1, 8}, {7, 130}, {65, 64}, {3, 1000}, {130, 257}};

// x [rows, C] with values offset + N(0, 1).
naive::Vec offset_normal(int64_t n, uint32_t seed, double offset) {
  naive::Vec x = naive::random_normal(n, seed);
  for (double& v : x) v += offset;
  return x;
}

}  // namespace

TEMPLATE_TEST_CASE("layernorm_forward matches the naive layernorm", "[kernels][norm]", float, double) {
  using T = TestType;
  uint32_t seed = 20;
  for (const RowsC& sh : kNormShapes) {
    for (const double offset : {0.0, 100.0}) {
      for (const bool with_bias : {true, false}) {
        INFO("rows " << sh.rows << " C " << sh.C << " offset " << offset << " bias " << with_bias);
        const auto x = test::cast<T>(offset_normal(sh.rows * sh.C, seed++, offset));
        const auto w = test::cast<T>(naive::random_normal(sh.C, seed++));
        const auto b = with_bias ? test::cast<T>(naive::random_normal(sh.C, seed++)) : std::vector<T>{};
        std::vector<T> y(x.size()), mean(static_cast<size_t>(sh.rows)), rstd(static_cast<size_t>(sh.rows));
        cpu::layernorm_forward<T>(x.data(), w.data(), with_bias ? b.data() : nullptr, y.data(),
                                  mean.data(), rstd.data(), sh.rows, sh.C, 1e-5);
        naive::Vec ref_mean, ref_rstd;
        const naive::Vec ref = naive::layernorm(test::widen(x), test::widen(w), test::widen(b),
                                                sh.rows, sh.C, 1e-5, &ref_mean, &ref_rstd);
        test::check_close(y, ref);
        test::check_close(mean, ref_mean);
        test::check_close(rstd, ref_rstd);
        std::vector<T> y2(x.size());  // statistics are optional
        cpu::layernorm_forward<T>(x.data(), w.data(), with_bias ? b.data() : nullptr, y2.data(),
                                  nullptr, nullptr, sh.rows, sh.C, 1e-5);
        CHECK(y2 == y);
      }
    }
  }
}

TEMPLATE_TEST_CASE("rmsnorm_forward matches the naive RMSNorm", "[kernels][norm]", float, double) {
  using T = TestType;
  uint32_t seed = 40;
  for (const RowsC& sh : kNormShapes) {
    for (const double offset : {0.0, 3.0}) {
      INFO("rows " << sh.rows << " C " << sh.C << " offset " << offset);
      const auto x = test::cast<T>(offset_normal(sh.rows * sh.C, seed++, offset));
      const auto w = test::cast<T>(naive::random_normal(sh.C, seed++));
      std::vector<T> y(x.size()), rstd(static_cast<size_t>(sh.rows));
      cpu::rmsnorm_forward<T>(x.data(), w.data(), y.data(), rstd.data(), sh.rows, sh.C, 1e-6);
      naive::Vec ref_rstd;
      const naive::Vec ref =
          naive::rmsnorm(test::widen(x), test::widen(w), sh.rows, sh.C, 1e-6, &ref_rstd);
      test::check_close(y, ref);
      test::check_close(rstd, ref_rstd);
    }
  }
}

TEMPLATE_TEST_CASE("softmax_forward matches the naive softmax", "[kernels][norm]", float, double) {
  using T = TestType;
  uint32_t seed = 60;
  for (const RowsC& sh : kNormShapes) {
    for (const double offset : {0.0, 500.0}) {
      INFO("rows " << sh.rows << " C " << sh.C << " offset " << offset);
      const auto x = test::cast<T>(offset_normal(sh.rows * sh.C, seed++, offset));
      std::vector<T> y(x.size());
      cpu::softmax_forward<T>(x.data(), y.data(), sh.rows, sh.C);
      const naive::Vec ref = naive::softmax(test::widen(x), sh.rows, sh.C);
      test::check_close(y, ref);
      std::vector<T> z = x;  // in place
      cpu::softmax_forward<T>(z.data(), z.data(), sh.rows, sh.C);
      CHECK(z == y);
    }
  }
}
