// CPU cross_entropy_sum and count_valid against the naive double cross-entropy: odd shapes, large
// logits (stability), ignore_index (default and custom), and UsageError for a bad label.
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
