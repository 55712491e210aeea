// CPU gemm_batched against the naive GEMM: transposes, alpha/beta, stride-0 batch broadcast, sizes
// on both sides of the parallel-over-batch threshold, and K = 0.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/matmul.h"

namespace {

using namespace autosp;

struct GemmCase {
  bool ta, tb;
  int64_t batch, M, N, K;
  bool bcast_a, bcast_b;  // stride 0 over the batch
  double alpha, beta;
};

template <class T>
void run_gemm_case(const GemmCase& g, uint32_t seed) {
  INFO("ta " << g.ta << " tb " << g.tb << " batch " << g.batch << " M " << g.M << " N " << g.N
             << " K " << g.K << " bcast " << g.bcast_a << g.bcast_b << " alpha " << g.alpha
             << " beta " << g.beta);
  const int64_t sa = g.bcast_a ? 0 : g.M * g.K, sb = g.bcast_b ? 0 : g.K * g.N, sc = g.M * g.N;
  const auto a = test::cast<T>(naive::random_normal(g.bcast_a ? g.M * g.K : g.batch * sa, seed));
  const auto b = test::cast<T>(naive::random_normal(g.bcast_b ? g.K * g.N : g.batch * sb, seed + 1));
  auto c = test::cast<T>(naive::random_normal(g.batch * sc, seed + 2));
  const naive::Vec c0 = test::widen(c);
  cpu::gemm_batched<T>(g.ta, g.tb, g.batch, g.M, g.N, g.K, T(g.alpha), a.data(), sa, b.data(), sb,
                       T(g.beta), c.data(), sc);
  naive::Vec ref, mag;  // mag: the same GEMM on absolute values, the scale of its rounding error
  const naive::Vec aw = test::widen(a), bw = test::widen(b);
  auto abs_of = [](naive::Vec x) {
    for (double& v : x) v = std::abs(v);
    return x;
  };
  for (int64_t p = 0; p < g.batch; ++p) {
    const naive::Vec ap(aw.begin() + p * sa, aw.begin() + p * sa + g.M * g.K);
    const naive::Vec bp(bw.begin() + p * sb, bw.begin() + p * sb + g.K * g.N);
    const naive::Vec cp(c0.begin() + p * sc, c0.begin() + (p + 1) * sc);
    const naive::Vec r = naive::gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, ap, bp, g.beta, cp);
    const naive::Vec m = naive::gemm(g.ta, g.tb, g.M, g.N, g.K, std::abs(g.alpha), abs_of(ap),
                                     abs_of(bp), std::abs(g.beta), abs_of(cp));
    ref.insert(ref.end(), r.begin(), r.end());
    mag.insert(mag.end(), m.begin(), m.end());
  }
  test::check_close(c, ref, test::tol<T>(), &mag);
}

const GemmCase kGemmCases[] = {
    {false, false, 1, 1, 1, 1, false, false, 1.0, 0.0},
    {false, false, 1, 7, 5, 3, false, false, 1.0, 0.0},
    {true, false, 3, 7, 5, 3, false, false, 1.0, 0.0},
    {false, true, 3, 65, 17, 33, false, false, 0.5, 1.0},
    {true, true, 2, 16, 65, 9, false, false, -1.5, 0.25},
    {false, false, 37, 8, 8, 8, false, true, 1.0, 0.0},    // many small GEMMs, shared B
    {false, true, 37, 9, 11, 13, true, false, 1.0, 1.0},   // shared A, accumulate
    {true, false, 12, 30, 33, 20, false, true, 1.0, 0.5},  // mid-sized: spread over the batch
    {false, true, 9, 40, 40, 40, true, false, -1.0, 0.0},
    {true, true, 5, 130, 65, 64, false, false, 1.0, 0.0},  // large: one threaded BLAS call each
    {false, false, 2, 100, 101, 102, true, true, 2.0, -1.0},
    {true, false, 4, 6, 10, 0, false, false, 1.0, 0.5},    // K = 0: C = beta · C
    {true, false, 4, 6, 10, 0, false, false, 1.0, 0.0},
};

}  // namespace

TEMPLATE_TEST_CASE("gemm_batched matches the naive GEMM", "[kernels][matmul]", float, double) {
  uint32_t seed = 100;
  for (const GemmCase& g : kGemmCases) run_gemm_case<TestType>(g, seed++);
}

TEST_CASE("gemm_batched beta = 0 overwrites NaN in C", "[kernels][matmul]") {
  const std::vector<double> a = {1, 2, 3, 4}, b = {1, 0, 0, 1};  // [2, 2] each
  std::vector<double> c(4, std::nan(""));
  cpu::gemm_batched<double>(false, false, 1, 2, 2, 2, 1.0, a.data(), 0, b.data(), 0, 0.0, c.data(), 0);
  CHECK(c == std::vector<double>{1, 2, 3, 4});
}

TEST_CASE("set_num_threads reaches OpenMP", "[kernels][matmul]") {
  const int before = cpu::num_threads();
  cpu::set_num_threads(1);
  CHECK(cpu::num_threads() == 1);
  cpu::set_num_threads(0);  // leaves it as is
  CHECK(cpu::num_threads() == 1);
  cpu::set_num_threads(before);
  CHECK(cpu::num_threads() == before);
}
