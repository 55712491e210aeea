// CPU gemm_batched against the naive GEMM: transposes, alpha/beta, stride-0 batch broadcast, sizes
// on both sides of the parallel-over-batch threshold, and K = 0. The packed AVX-512 sgemm directly
// against a float64 loop: sizes across its tile and block edges (14-row and 32-column micro-tiles,
// 256-deep, 336-row and 2048-column blocks), padded leading dimensions, both ways of splitting
// over threads, beta = 0 over NaN and accumulation.
#include <catch2/catch.hpp>

#include <algorithm>
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
    {false, true, 3, 1024, 96, 64, false, true, 1.0, 0.0},  // the model's shapes, on the packed path when f32
    {true, false, 2, 64, 96, 1024, false, false, 1.0, 1.0},
};

struct PackedCase {
  bool ta, tb;
  int64_t M, N, K;
  int64_t pad;  // added to every leading dimension
  double alpha, beta;
  int threads;
};

const PackedCase kPackedCases[] = {
    {false, false, 1, 1, 1, 0, 1.0, 0.0, 1},
    {false, false, 14, 32, 256, 0, 1.0, 0.0, 1},    // exactly one micro-tile, one k-block
    {false, false, 13, 31, 7, 3, 1.0, 0.0, 1},      // under one tile
    {true, false, 15, 33, 257, 1, -0.5, 1.0, 1},    // one past each edge
    {false, true, 29, 65, 300, 5, 2.0, 0.5, 2},     // two threads, split over B micro-panels
    {true, true, 43, 97, 513, 0, 1.0, 0.0, 2},      // three k-blocks, split over rows
    {false, false, 337, 70, 40, 2, 1.0, 1.0, 2},    // one row past an A block
    {false, true, 3, 2100, 20, 0, 1.0, 0.0, 2},     // past a B block, M too small to split
    {true, false, 700, 40, 600, 7, 0.25, -1.0, 2},
    {false, false, 1000, 3, 1, 0, 1.0, 0.0, 2},     // K = 1, one column
    {true, true, 1, 1000, 33, 1, 1.0, 0.0, 2},
    {false, false, 200, 64, 64, 0, 1.0, 0.0, 3},    // more threads than the machine has cores
    {true, false, 70, 128, 300, 1, 1.0, 0.5, 2},    // 5 row panels split 3 / 2, 4 column panels 2 / 2: by columns
    {false, false, 256, 768, 40, 0, 1.0, 0.0, 2},   // M = 256: 19 row panels, 24 column panels: by columns
    // A stored [K, M] is packed 16 k at a time and B stored [K, N] 8 rows at a time: depths with a
    // tail in the last k-block (600 = 2 · 256 + 5 · 16 + 8, 523 = 2 · 256 + 8 + 3), several A blocks
    // per thread (the next block's prefetch crosses to the next k-block), both splits, beta 0 and 1.
    {true, false, 700, 96, 600, 0, 1.0, 0.0, 1},
    {true, false, 700, 96, 523, 2, 1.0, 1.0, 2},
    {false, false, 1030, 64, 523, 1, -1.0, 0.0, 2},
    {false, false, 50, 200, 600, 3, 0.5, 1.0, 2},   // M too small to split: by B micro-panels
    {true, true, 380, 70, 300, 0, 1.0, 0.0, 2},
};

}  // namespace

TEST_CASE("packed_sgemm matches a float64 loop", "[kernels][matmul]") {
  if (!cpu::packed_sgemm_available()) {
    WARN("no AVX-512F on this CPU: the packed sgemm is not used, nothing to test");
    return;
  }
  uint32_t seed = 300;
  for (const PackedCase& g : kPackedCases) {
    INFO("ta " << g.ta << " tb " << g.tb << " M " << g.M << " N " << g.N << " K " << g.K << " pad " << g.pad
               << " alpha " << g.alpha << " beta " << g.beta << " threads " << g.threads);
    const int64_t lda = (g.ta ? g.M : g.K) + g.pad, ldb = (g.tb ? g.K : g.N) + g.pad, ldc = g.N + g.pad;
    const auto a = test::cast<float>(naive::random_normal((g.ta ? g.K : g.M) * lda, seed++));
    const auto b = test::cast<float>(naive::random_normal((g.tb ? g.N : g.K) * ldb, seed++));
    auto c = test::cast<float>(naive::random_normal(g.M * ldc, seed++));
    if (g.beta == 0) std::fill(c.begin(), c.end(), std::nanf(""));  // must be overwritten, not read
    const naive::Vec aw = test::widen(a), bw = test::widen(b), c0 = test::widen(c);
    cpu::packed_sgemm(g.ta, g.tb, g.M, g.N, g.K, float(g.alpha), a.data(), lda, b.data(), ldb, float(g.beta),
                      c.data(), ldc, g.threads);
    naive::Vec ref = naive::strided_gemm(g, lda, ldb, ldc, aw, bw, c0, false);
    naive::Vec mag = naive::strided_gemm(g, lda, ldb, ldc, aw, bw, c0, true);
    // The padding columns of C are never written: they keep C0 (NaN where beta = 0).
    std::vector<float> got;
    naive::Vec ref_in, mag_in;
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < ldc; ++j) {
        if (j >= g.N) {
          CHECK((std::isnan(c[i * ldc + j]) ? std::isnan(c0[i * ldc + j]) : c[i * ldc + j] == c0[i * ldc + j]));
          continue;
        }
        got.push_back(c[i * ldc + j]);
        ref_in.push_back(ref[i * ldc + j]);
        mag_in.push_back(mag[i * ldc + j]);
      }
    test::check_close(got, ref_in, test::tol<float>(), &mag_in);
  }
}

TEST_CASE("packed_sgemm gives the same bits at any thread count", "[kernels][matmul]") {
  if (!cpu::packed_sgemm_available()) {
    WARN("no AVX-512F on this CPU: the packed sgemm is not used, nothing to test");
    return;
  }
  const int64_t M = 300, N = 200, K = 520;
  const auto a = test::cast<float>(naive::random_normal(M * K, 7));
  const auto b = test::cast<float>(naive::random_normal(K * N, 8));
  std::vector<float> c1(M * N), c2(M * N);
  cpu::packed_sgemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c1.data(), N, 1);
  cpu::packed_sgemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c2.data(), N, 2);
  CHECK(c1 == c2);
}

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
