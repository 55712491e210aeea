// CPU cross_entropy_sum and count_valid against the naive double cross-entropy: odd shapes, large
// logits (stability), ignore_index (default and custom), and UsageError for a bad label.
// cross_entropy_backward against the naive softmax - onehot and central differences of
// cross_entropy_sum (double).
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/loss.h"
#include "tensor/check.h"

namespace {

using namespace autosp;

std::vector<int64_t> random_labels(int64_t rows, int64_t V, uint32_t seed, int64_t ignore_index) {
  std::mt19937 gen(seed);
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (int64_t& y : labels) y = gen() % 5 == 0 ? ignore_index : int64_t(gen() % uint32_t(V));
  return labels;
}

}  // namespace

TEMPLATE_TEST_CASE("cross_entropy_sum matches the naive cross-entropy", "[kernels][loss]", float,
                   double) {
  using T = TestType;
  struct Case {
    int64_t rows, V;
  };
  uint32_t seed = 700;
  for (const Case c : {Case{1, 1}, Case{7, 10}, Case{65, 1000}, Case{130, 257}, Case{3, 50000}}) {
    for (const double offset : {0.0, 1000.0}) {
      INFO("rows " << c.rows << " V " << c.V << " offset " << offset);
      naive::Vec logits = naive::random_normal(c.rows * c.V, seed++, 3.0);
      for (double& x : logits) x += offset;
      const auto lt = test::cast<T>(logits);
      const auto labels = random_labels(c.rows, c.V, seed++, cpu::kIgnoreIndex);
      const double got = cpu::cross_entropy_sum<T>(lt.data(), labels.data(), c.rows, c.V);
      const double ref = naive::cross_entropy(test::widen(lt), labels, c.rows, c.V, cpu::kIgnoreIndex);
      test::check_close(std::vector<double>{got}, {ref}, test::tol<T>());
      CHECK(cpu::count_valid(labels.data(), c.rows) ==
            std::count_if(labels.begin(), labels.end(), [](int64_t y) { return y != -100; }));
    }
  }
}

TEST_CASE("cross_entropy_sum skips ignored rows", "[kernels][loss]") {
  // Two rows of V = 2: row 0 has equal logits (loss log 2), row 1 is ignored.
  const std::vector<double> logits = {1.0, 1.0, 5.0, -5.0};
  const std::vector<int64_t> labels = {1, cpu::kIgnoreIndex};
  CHECK(cpu::cross_entropy_sum<double>(logits.data(), labels.data(), 2, 2) ==
        Approx(std::log(2.0)).epsilon(1e-14));
  CHECK(cpu::count_valid(labels.data(), 2) == 1);
  // A custom ignore_index: label 1 is now ignored, and -100 is an error.
  const std::vector<int64_t> custom = {1, 0};
  CHECK(cpu::cross_entropy_sum<double>(logits.data(), custom.data(), 2, 2, 1) ==
        Approx(std::log1p(std::exp(-10.0))).margin(1e-14));
  CHECK(cpu::count_valid(custom.data(), 2, 1) == 1);
  CHECK_THROWS_AS(cpu::cross_entropy_sum<double>(logits.data(), labels.data(), 2, 2, 1), UsageError);
  // Every row ignored: nothing to sum.
  const std::vector<int64_t> none = {cpu::kIgnoreIndex, cpu::kIgnoreIndex};
  CHECK(cpu::cross_entropy_sum<double>(logits.data(), none.data(), 2, 2) == 0.0);
  CHECK(cpu::count_valid(none.data(), 2) == 0);
}

TEMPLATE_TEST_CASE("cross_entropy_sum rejects a label outside [0, V)", "[kernels][loss]", float,
                   double) {
  using T = TestType;
  const std::vector<T> logits(4 * 10, T(0));
  std::vector<int64_t> labels = {0, 9, 3, 10};
  CHECK_THROWS_AS(cpu::cross_entropy_sum<T>(logits.data(), labels.data(), 4, 10), UsageError);
  CHECK_THROWS_WITH(cpu::cross_entropy_sum<T>(logits.data(), labels.data(), 4, 10),
                    Catch::Contains("label 10") && Catch::Contains("row 3"));
  labels[3] = -1;
  CHECK_THROWS_WITH(cpu::cross_entropy_sum<T>(logits.data(), labels.data(), 4, 10),
                    Catch::Contains("label -1") && Catch::Contains("row 3"));
  labels[3] = 2;
  CHECK_NOTHROW(cpu::cross_entropy_sum<T>(logits.data(), labels.data(), 4, 10));
}

TEMPLATE_TEST_CASE("cross_entropy_backward matches the naive gradient", "[kernels][loss][backward]", float,
                   double) {
  using T = TestType;
  struct Case {
    int64_t rows, V;
  };
  uint32_t seed = 2700;
  for (const Case c : {Case{1, 1}, Case{7, 10}, Case{65, 1000}, Case{130, 257}, Case{3, 50000}}) {
    for (const double offset : {0.0, 1000.0}) {
      INFO("rows " << c.rows << " V " << c.V << " offset " << offset);
      naive::Vec logits = naive::random_normal(c.rows * c.V, seed++, 3.0);
      for (double& x : logits) x += offset;
      const auto lt = test::cast<T>(logits);
      const auto labels = random_labels(c.rows, c.V, seed++, cpu::kIgnoreIndex);
      const double grad = 0.37;
      std::vector<T> d(lt.size(), T(-777));
      cpu::cross_entropy_backward<T>(lt.data(), labels.data(), d.data(), c.rows, c.V, grad);
      test::check_close(d, naive::cross_entropy_backward(test::widen(lt), labels, c.rows, c.V, grad));
      for (int64_t r = 0; r < c.rows; ++r)  // ignored rows are exactly zero
        if (labels[size_t(r)] == cpu::kIgnoreIndex)
          for (int64_t j = 0; j < c.V; ++j) REQUIRE(d[size_t(r * c.V + j)] == T(0));
    }
  }
  // A custom ignore_index.
  const std::vector<T> logits = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> labels = {1, 0};
  std::vector<T> d(6, T(-777));
  cpu::cross_entropy_backward<T>(logits.data(), labels.data(), d.data(), 2, 3, 1.0, 1);
  test::check_close(d, naive::cross_entropy_backward(test::widen(logits), labels, 2, 3, 1.0, 1));
  CHECK(d[0] == T(0));
}

TEST_CASE("cross_entropy_backward agrees with central differences of cross_entropy_sum",
          "[kernels][loss][backward]") {
  uint32_t seed = 2800;
  for (const int64_t V : {int64_t(2), int64_t(10), int64_t(1000)}) {
    INFO("V " << V);
    const int64_t rows = 13;
    naive::Vec logits = naive::random_normal(rows * V, seed++, 2.0);
    const auto labels = random_labels(rows, V, seed++, cpu::kIgnoreIndex);
    const double grad = 1.0 / 13;
    std::vector<double> d(logits.size());
    cpu::cross_entropy_backward<double>(logits.data(), labels.data(), d.data(), rows, V, grad);
    test::check_directional(logits, naive::random_normal(rows * V, seed++), d, [&] {
      return grad * cpu::cross_entropy_sum<double>(logits.data(), labels.data(), rows, V);
    });
  }
}
