// CPU embedding_forward against the naive lookup, and UsageError for an id outside [0, V).
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/embedding.h"
#include "tensor/check.h"

using namespace autosp;

TEMPLATE_TEST_CASE("embedding_forward matches the naive lookup", "[kernels][embedding]", float,
                   double) {
  using T = TestType;
  struct Case {
    int64_t n, V, C;
  };
  uint32_t seed = 800;
  for (const Case c : {Case{0, 5, 3}, Case{1, 1, 1}, Case{7, 10, 130}, Case{4096, 1000, 16}}) {
    INFO("n " << c.n << " V " << c.V << " C " << c.C);
    const auto w = test::cast<T>(naive::random_normal(c.V * c.C, seed++));
    std::mt19937 gen(seed++);
    std::vector<int64_t> ids(static_cast<size_t>(c.n));
    for (int64_t& id : ids) id = int64_t(gen() % uint32_t(c.V));  // repeats are expected
    std::vector<T> out(static_cast<size_t>(c.n * c.C), T(-777));
    cpu::embedding_forward<T>(w.data(), ids.data(), out.data(), c.n, c.V, c.C);
    CHECK(test::widen(out) == naive::embedding(test::widen(w), ids, c.C));
  }
}

TEST_CASE("embedding_forward rejects an id outside [0, V)", "[kernels][embedding]") {
  const std::vector<float> w(10 * 4, 1.0f);
  std::vector<float> out(3 * 4);
  std::vector<int64_t> ids = {0, 10, 9};
  CHECK_THROWS_AS(cpu::embedding_forward<float>(w.data(), ids.data(), out.data(), 3, 10, 4), UsageError);
  CHECK_THROWS_WITH(cpu::embedding_forward<float>(w.data(), ids.data(), out.data(), 3, 10, 4),
                    Catch::Contains("id 10"));
  ids[1] = -3;
  CHECK_THROWS_WITH(cpu::embedding_forward<float>(w.data(), ids.data(), out.data(), 3, 10, 4),
                    Catch::Contains("id -3"));
}
