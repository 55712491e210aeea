// CPU embedding_forward against the naive lookup, and UsageError for an id outside [0, V).
// embedding_backward against the naive scatter-add (repeated ids, a dominant id, unused rows),
// central differences of embedding_forward, and bitwise across thread counts.
#include <catch2/catch.hpp>

#include <algorithm>
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

namespace {

// n ids in [0, V); with `skewed`, half of them are id 1 (like a padding token).
std::vector<int64_t> random_ids(int64_t n, int64_t V, uint32_t seed, bool skewed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t& id : ids) id = skewed && gen() % 2 == 0 ? std::min<int64_t>(1, V - 1) : int64_t(gen() % uint32_t(V));
  return ids;
}

}  // namespace

TEMPLATE_TEST_CASE("embedding_backward matches the naive scatter-add", "[kernels][embedding][backward]", float,
                   double) {
  using T = TestType;
  struct Case {
    int64_t n, V, C;
    bool skewed;
  };
  uint32_t seed = 2900;
  for (const Case c : {Case{0, 5, 3, false}, Case{1, 1, 1, false}, Case{7, 10, 130, false},
                       Case{4096, 1000, 16, false}, Case{4096, 1000, 16, true}, Case{300, 70, 1100, true}}) {
    INFO("n " << c.n << " V " << c.V << " C " << c.C << " skewed " << c.skewed);
    const auto dy = test::cast<T>(naive::random_normal(c.n * c.C, seed++));
    const auto ids = random_ids(c.n, c.V, seed++, c.skewed);
    std::vector<T> dw(static_cast<size_t>(c.V * c.C), T(-777));  // overwritten, unused rows too
    cpu::embedding_backward<T>(dy.data(), ids.data(), dw.data(), c.n, c.V, c.C);
    test::check_close(dw, naive::embedding_backward(test::widen(dy), ids, c.V, c.C));
  }
}

TEST_CASE("embedding_backward agrees with central differences of embedding_forward",
          "[kernels][embedding][backward]") {
  const int64_t n = 50, V = 20, C = 9;
  naive::Vec w = naive::random_normal(V * C, 3000);
  const naive::Vec dy = naive::random_normal(n * C, 3001);
  const auto ids = random_ids(n, V, 3002, false);
  std::vector<double> y(static_cast<size_t>(n * C)), dw(static_cast<size_t>(V * C));
  cpu::embedding_backward<double>(dy.data(), ids.data(), dw.data(), n, V, C);
  test::check_directional(w, naive::random_normal(V * C, 3003), dw, [&] {
    cpu::embedding_forward<double>(w.data(), ids.data(), y.data(), n, V, C);
    return test::dot(y, dy);
  });
}

TEMPLATE_TEST_CASE("embedding_backward does not depend on the thread count", "[kernels][embedding][backward]",
                   float, double) {
  using T = TestType;
  const int64_t n = 8192, V = 3000, C = 96;
  const auto dy = test::cast<T>(naive::random_normal(n * C, 3100));
  const auto ids = random_ids(n, V, 3101, true);
  std::vector<T> first;
  test::with_threads({1, 2, 3}, [&](int threads) {
    INFO("threads " << threads);
    std::vector<T> dw(static_cast<size_t>(V * C));
    cpu::embedding_backward<T>(dy.data(), ids.data(), dw.data(), n, V, C);
    if (threads == 1) first = dw;
    else CHECK(dw == first);
  });
}
