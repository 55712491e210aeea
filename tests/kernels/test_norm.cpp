// CPU layernorm, RMSNorm and softmax against naive double references over odd shapes, including
// inputs with a large common offset (catches one-pass variance) and large logits (catches a
// softmax without the max shift). Backward: against the naive explicit-Jacobian references, against
// central differences of the forward kernels (double), and bitwise across thread counts for the
// parameter gradients (sums over rows).
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

// ---- backward ----------------------------------------------------------------------------------

namespace {

// Shapes for the backward tests: the forward's plus wide rows (column blocks in the row sums) and
// many rows (chunked row sums run in parallel).
const RowsC kNormBackwardShapes[] = {{1, 1}, {1, 8}, {7, 130}, {65, 64}, {3, 1000}, {130, 257}, {5, 3000},
                                     {6000, 24}};

}  // namespace

TEMPLATE_TEST_CASE("layernorm backward matches the naive Jacobian", "[kernels][norm][backward]", float, double) {
  using T = TestType;
  uint32_t seed = 1020;
  for (const RowsC& sh : kNormBackwardShapes) {
    for (const double offset : {0.0, 100.0}) {
      INFO("rows " << sh.rows << " C " << sh.C << " offset " << offset);
      const auto x = test::cast<T>(offset_normal(sh.rows * sh.C, seed++, offset));
      const auto w = test::cast<T>(naive::random_normal(sh.C, seed++));
      const auto dy = test::cast<T>(naive::random_normal(sh.rows * sh.C, seed++));
      std::vector<T> dx(x.size(), T(-777)), dw(size_t(sh.C), T(-777)), db(size_t(sh.C), T(-777));
      cpu::layernorm_backward_input<T>(dy.data(), x.data(), w.data(), dx.data(), sh.rows, sh.C, 1e-5);
      cpu::layernorm_backward_params<T>(dy.data(), x.data(), dw.data(), db.data(), sh.rows, sh.C, 1e-5);
      naive::Vec ref_dx, ref_dw, ref_db;
      naive::layernorm_backward(test::widen(dy), test::widen(x), test::widen(w), sh.rows, sh.C, 1e-5, ref_dx,
                                ref_dw, ref_db);
      test::check_close(dx, ref_dx);
      test::check_close(dw, ref_dw);
      test::check_close(db, ref_db);
      std::vector<T> dw2(size_t(sh.C), T(-777));  // db is optional
      cpu::layernorm_backward_params<T>(dy.data(), x.data(), dw2.data(), nullptr, sh.rows, sh.C, 1e-5);
      CHECK(dw2 == dw);
      // The one-pass form (the op's) against the reference, and the same values as the two calls.
      std::vector<T> dx1(x.size(), T(-777)), dw1(size_t(sh.C), T(-777)), db1(size_t(sh.C), T(-777));
      cpu::layernorm_backward<T>(dy.data(), x.data(), w.data(), dx1.data(), dw1.data(), db1.data(), sh.rows, sh.C, 1e-5);
      test::check_close(dx1, ref_dx);
      test::check_close(dw1, ref_dw);
      test::check_close(db1, ref_db);
      CHECK(dx1 == dx);
      CHECK(dw1 == dw);
      CHECK(db1 == db);
    }
  }
}

TEMPLATE_TEST_CASE("rmsnorm backward matches the naive Jacobian", "[kernels][norm][backward]", float, double) {
  using T = TestType;
  uint32_t seed = 1040;
  for (const RowsC& sh : kNormBackwardShapes) {
    for (const double offset : {0.0, 3.0}) {
      INFO("rows " << sh.rows << " C " << sh.C << " offset " << offset);
      const auto x = test::cast<T>(offset_normal(sh.rows * sh.C, seed++, offset));
      const auto w = test::cast<T>(naive::random_normal(sh.C, seed++));
      const auto dy = test::cast<T>(naive::random_normal(sh.rows * sh.C, seed++));
      std::vector<T> dx(x.size(), T(-777)), dw(size_t(sh.C), T(-777));
      cpu::rmsnorm_backward_input<T>(dy.data(), x.data(), w.data(), dx.data(), sh.rows, sh.C, 1e-6);
      cpu::rmsnorm_backward_weight<T>(dy.data(), x.data(), dw.data(), sh.rows, sh.C, 1e-6);
      naive::Vec ref_dx, ref_dw;
      naive::rmsnorm_backward(test::widen(dy), test::widen(x), test::widen(w), sh.rows, sh.C, 1e-6, ref_dx, ref_dw);
      test::check_close(dx, ref_dx);
      test::check_close(dw, ref_dw);
    }
  }
}

TEMPLATE_TEST_CASE("softmax_backward matches the naive Jacobian", "[kernels][norm][backward]", float, double) {
  using T = TestType;
  uint32_t seed = 1060;
  for (const RowsC& sh : kNormBackwardShapes) {
    if (sh.C > 1000) continue;  // the O(C²) reference
    INFO("rows " << sh.rows << " C " << sh.C);
    const auto y = test::cast<T>(naive::softmax(naive::random_normal(sh.rows * sh.C, seed++, 3.0), sh.rows, sh.C));
    const auto dy = test::cast<T>(naive::random_normal(sh.rows * sh.C, seed++));
    std::vector<T> dx(y.size(), T(-777));
    cpu::softmax_backward<T>(dy.data(), y.data(), dx.data(), sh.rows, sh.C);
    test::check_close(dx, naive::softmax_backward(test::widen(dy), test::widen(y), sh.rows, sh.C));
  }
}

TEST_CASE("norm backward agrees with central differences of the forward", "[kernels][norm][backward]") {
  uint32_t seed = 1080;
  for (const RowsC& sh : {RowsC{1, 8}, RowsC{7, 130}, RowsC{65, 64}}) {
    INFO("rows " << sh.rows << " C " << sh.C);
    const int64_t n = sh.rows * sh.C;
    naive::Vec x = offset_normal(n, seed++, 0.5), w = naive::random_normal(sh.C, seed++),
               b = naive::random_normal(sh.C, seed++);
    const naive::Vec dy = naive::random_normal(n, seed++), ux = naive::random_normal(n, seed++),
                     uc = naive::random_normal(sh.C, seed++);
    std::vector<double> y(static_cast<size_t>(n)), dx(static_cast<size_t>(n)), dw(static_cast<size_t>(sh.C)), db(static_cast<size_t>(sh.C));

    auto layernorm_loss = [&] {
      cpu::layernorm_forward<double>(x.data(), w.data(), b.data(), y.data(), nullptr, nullptr, sh.rows, sh.C, 1e-5);
      return test::dot(y, dy);
    };
    cpu::layernorm_backward_input<double>(dy.data(), x.data(), w.data(), dx.data(), sh.rows, sh.C, 1e-5);
    cpu::layernorm_backward_params<double>(dy.data(), x.data(), dw.data(), db.data(), sh.rows, sh.C, 1e-5);
    test::check_directional(x, ux, dx, layernorm_loss);
    test::check_directional(w, uc, dw, layernorm_loss);
    test::check_directional(b, uc, db, layernorm_loss);

    auto rmsnorm_loss = [&] {
      cpu::rmsnorm_forward<double>(x.data(), w.data(), y.data(), nullptr, sh.rows, sh.C, 1e-6);
      return test::dot(y, dy);
    };
    cpu::rmsnorm_backward_input<double>(dy.data(), x.data(), w.data(), dx.data(), sh.rows, sh.C, 1e-6);
    cpu::rmsnorm_backward_weight<double>(dy.data(), x.data(), dw.data(), sh.rows, sh.C, 1e-6);
    test::check_directional(x, ux, dx, rmsnorm_loss);
    test::check_directional(w, uc, dw, rmsnorm_loss);

    auto softmax_loss = [&] {
      cpu::softmax_forward<double>(x.data(), y.data(), sh.rows, sh.C);
      return test::dot(y, dy);
    };
    std::vector<double> sm(static_cast<size_t>(n));
    cpu::softmax_forward<double>(x.data(), sm.data(), sh.rows, sh.C);
    cpu::softmax_backward<double>(dy.data(), sm.data(), dx.data(), sh.rows, sh.C);
    test::check_directional(x, ux, dx, softmax_loss);
  }
}

TEMPLATE_TEST_CASE("norm parameter gradients do not depend on the thread count", "[kernels][norm][backward]",
                   float, double) {
  using T = TestType;
  for (const RowsC& sh : {RowsC{2000, 300}, RowsC{300, 3000}, RowsC{4096, 7}}) {
    INFO("rows " << sh.rows << " C " << sh.C);
    const auto x = test::cast<T>(naive::random_normal(sh.rows * sh.C, 1100));
    const auto dy = test::cast<T>(naive::random_normal(sh.rows * sh.C, 1101));
    std::vector<T> dw1, db1, rw1;
    test::with_threads({1, 2, 3}, [&](int threads) {
      INFO("threads " << threads);
      std::vector<T> dw(static_cast<size_t>(sh.C)), db(static_cast<size_t>(sh.C)), rw(static_cast<size_t>(sh.C));
      cpu::layernorm_backward_params<T>(dy.data(), x.data(), dw.data(), db.data(), sh.rows, sh.C, 1e-5);
      cpu::rmsnorm_backward_weight<T>(dy.data(), x.data(), rw.data(), sh.rows, sh.C, 1e-6);
      // The one-pass form keeps each row's statistics from its dx pass: the same sums.
      const std::vector<T> w(static_cast<size_t>(sh.C), T(1.5));
      std::vector<T> dx(x.size()), dw_one(static_cast<size_t>(sh.C)), db_one(static_cast<size_t>(sh.C));
      cpu::layernorm_backward<T>(dy.data(), x.data(), w.data(), dx.data(), dw_one.data(), db_one.data(), sh.rows, sh.C,
                                 1e-5);
      CHECK(dw_one == dw);
      CHECK(db_one == db);
      if (threads == 1) {
        dw1 = dw, db1 = db, rw1 = rw;
      } else {
        CHECK(dw == dw1);
        CHECK(db == db1);
        CHECK(rw == rw1);
      }
    });
  }
}
