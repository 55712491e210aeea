// CUDA embedding forward (exact) and backward (against the CPU, bitwise deterministic) on the
// op-case shape and a larger vocabulary with a very frequent id; an invalid id gives a NaN row.
#include <cmath>

#include "cuda/cuda_test.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/embedding.cuh"

using namespace autosp;
using namespace autosp::cudatest;

TEMPLATE_TEST_CASE("cuda embedding matches the CPU", "[cuda][embedding]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  struct Case {
    int64_t n, V, C;
  };
  uint32_t seed = 300;
  for (const Case c : {Case{10, 11, 4}, Case{8192, 5000, 256}, Case{1, 3, 1}, Case{0, 7, 5}}) {
    INFO("n " << c.n << " V " << c.V << " C " << c.C);
    std::vector<int64_t> ids(static_cast<size_t>(c.n));
    for (int64_t i = 0; i < c.n; ++i) ids[size_t(i)] = i % 4 == 0 ? 7 % c.V : (i * i + 3 * i) % c.V;  // id 7 is hot
    const auto w = values<T>(naive::random_normal(c.V * c.C, seed++));
    const auto gy = values<T>(naive::random_normal(c.n * c.C, seed++));
    Dev<T> dw(w), dout(size_t(c.n * c.C)), dgy(gy), dgw(size_t(c.V * c.C)), dgw2(size_t(c.V * c.C));
    Dev<int64_t> dids(ids);

    std::vector<H> out(size_t(c.n * c.C));
    cpu::embedding_forward<H>(w.data(), ids.data(), out.data(), c.n, c.V, c.C);
    cuda::embedding_forward<T>(dw.get(), dids.get(), dout.get(), c.n, c.V, c.C, nullptr);
    check_identical(dout.download(), out);

    std::vector<H> gw(size_t(c.V * c.C));
    cpu::embedding_backward<H>(gy.data(), ids.data(), gw.data(), c.n, c.V, c.C);
    cuda::embedding_backward<T>(dgy.get(), dids.get(), dgw.get(), c.n, c.V, c.C, nullptr);
    cuda::embedding_backward<T>(dgy.get(), dids.get(), dgw2.get(), c.n, c.V, c.C, nullptr);
    std::vector<H> magnitude(gw.size());  // the hot id's row sums c.n / 4 gradient rows
    const auto abs_gy = absolute(gy);
    cpu::embedding_backward<H>(abs_gy.data(), ids.data(), magnitude.data(), c.n, c.V, c.C);
    const auto got = dgw.download();
    check_sum_against<T>(got, gw, magnitude);
    check_identical(got, dgw2.download());
  }
}

TEST_CASE("cuda embedding: an invalid id gives a NaN row, never an out-of-bounds read", "[cuda][embedding]") {
  const std::vector<int64_t> ids = {0, 5, -1, 2};
  const std::vector<float> w(5 * 3, 1.f);
  Dev<float> dw(w), dout(12);
  Dev<int64_t> dids(ids);
  cuda::embedding_forward<float>(dw.get(), dids.get(), dout.get(), 4, 5, 3, nullptr);
  const auto out = dout.download();
  for (int c = 0; c < 3; ++c) {
    CHECK(out[size_t(c)] == 1.f);
    CHECK(std::isnan(out[size_t(3 + c)]));
    CHECK(std::isnan(out[size_t(6 + c)]));
    CHECK(out[size_t(9 + c)] == 1.f);
  }
}
