// CUDA batched GEMM (cuBLASLt) against the CPU GEMM: the op-case shapes, every transpose
// combination at a larger size, a broadcast operand (stride 0), alpha/beta accumulation, odd
// sizes and K = 0.
#include "cuda/cuda_test.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/matmul.cuh"

using namespace autosp;
using namespace autosp::cudatest;

namespace {

struct GemmCase {
  bool ta, tb;
  int64_t batch, M, N, K;
  bool broadcast_b;  // stride_b = 0
  double alpha, beta;
};

const GemmCase kGemmCases[] = {
    {false, false, 1, 10, 3, 6, false, 1, 0},  // [B, S, 6] · [6, 3] folded into one GEMM
    {false, true, 1, 10, 3, 6, false, 1, 0},   // [B, S, 6] · [3, 6]ᵀ
    {true, false, 8, 5, 3, 6, false, 1, 0},    // [B, 4, 6, S]ᵀ · [B, 4, 6, 3]
    {false, true, 6, 5, 5, 4, false, 1, 0},    // [B, 3, S, 4] · [B, 3, S, 4]ᵀ
    {false, false, 3, 128, 96, 200, false, 1, 0},   {true, false, 3, 128, 96, 200, false, 1, 0},
    {false, true, 3, 128, 96, 200, false, 1, 0},    {true, true, 3, 128, 96, 200, false, 1, 0},
    {false, false, 4, 64, 256, 128, true, 1, 0},  // shared weight
    {false, true, 2, 33, 17, 65, false, 0.5, 1},  // odd sizes, accumulate into C
    {false, false, 2, 7, 5, 0, false, 1, 0.25},   // K = 0: C = beta · C
    {false, false, 1, 512, 1024, 768, false, 1, 0},
};

}  // namespace

TEMPLATE_TEST_CASE("cuda gemm_batched matches the CPU", "[cuda][matmul]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  uint32_t seed = 700;
  for (const GemmCase& c : kGemmCases) {
    INFO("ta " << c.ta << " tb " << c.tb << " batch " << c.batch << " M " << c.M << " N " << c.N << " K " << c.K
               << " broadcast_b " << c.broadcast_b << " alpha " << c.alpha << " beta " << c.beta);
    const int64_t sa = c.M * c.K, sb = c.broadcast_b ? 0 : c.K * c.N, sc = c.M * c.N;
    const auto a = values<T>(naive::random_normal(c.batch * sa, seed++));
    const auto b = values<T>(naive::random_normal(c.broadcast_b ? c.K * c.N : c.batch * sb, seed++));
    auto cref = values<T>(naive::random_normal(c.batch * sc, seed++));
    Dev<T> da(a), db(b), dc(cref);
    auto magnitude = absolute(cref);  // Σ|term| per element: the same product on absolute values
    cpu::gemm_batched<H>(c.ta, c.tb, c.batch, c.M, c.N, c.K, H(c.alpha), a.data(), sa, b.data(), sb, H(c.beta),
                         cref.data(), sc);
    const auto abs_a = absolute(a), abs_b = absolute(b);
    cpu::gemm_batched<H>(c.ta, c.tb, c.batch, c.M, c.N, c.K, H(std::abs(c.alpha)), abs_a.data(), sa, abs_b.data(), sb,
                         H(std::abs(c.beta)), magnitude.data(), sc);
    cuda::gemm_batched<T>(c.ta, c.tb, c.batch, c.M, c.N, c.K, c.alpha, da.get(), sa, db.get(), sb, c.beta, dc.get(), sc,
                          nullptr);
    check_sum_against<T>(dc.download(), cref, magnitude);
  }
}

TEST_CASE("cuda gemm_batched on two streams", "[cuda][matmul]") {
  // Each stream has its own workspace: the two products must not disturb each other.
  const int64_t M = 256, N = 256, K = 512;
  const auto a = values<float>(naive::random_normal(M * K, 710)), b = values<float>(naive::random_normal(K * N, 711));
  std::vector<float> ref(size_t(M * N));
  cpu::gemm_batched<float>(false, false, 1, M, N, K, 1.f, a.data(), 0, b.data(), 0, 0.f, ref.data(), 0);
  std::vector<float> magnitude(ref.size());
  const auto abs_a = absolute(a), abs_b = absolute(b);
  cpu::gemm_batched<float>(false, false, 1, M, N, K, 1.f, abs_a.data(), 0, abs_b.data(), 0, 0.f, magnitude.data(), 0);
  Dev<float> da(a), db(b), c1(size_t(M * N)), c2(size_t(M * N));
  cudaStream_t s1, s2;
  CUDA_CHECK(cudaStreamCreate(&s1));
  CUDA_CHECK(cudaStreamCreate(&s2));
  for (int i = 0; i < 4; ++i) {
    cuda::gemm_batched<float>(false, false, 1, M, N, K, 1.0, da.get(), 0, db.get(), 0, 0.0, c1.get(), 0, s1);
    cuda::gemm_batched<float>(false, false, 1, M, N, K, 1.0, da.get(), 0, db.get(), 0, 0.0, c2.get(), 0, s2);
  }
  check_sum_against<float>(c1.download(), ref, magnitude);
  check_sum_against<float>(c2.download(), ref, magnitude);
  CUDA_CHECK(cudaStreamDestroy(s1));
  CUDA_CHECK(cudaStreamDestroy(s2));
}

// gemm_bf16_f32 (cuBLASLt's bf16 × bf16 → f32 mode, the chunked weight gradients' sums): bf16
// inputs, an f32 C overwritten (beta 0), then added to twice (beta 1), against a double loop on the
// same rounded inputs. f32 accuracy: a C held in bf16 would be off by ~1e-2.
TEST_CASE("cuda gemm_bf16_f32 accumulates bf16 products in an f32 C", "[cuda][matmul]") {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      const int64_t M = 33, N = 17, K = 65;
      INFO("trans_a " << ta << " trans_b " << tb);
      const auto a = values<bf16>(naive::random_normal(M * K, 700 + 2 * ta + tb, 1.0));
      const auto b = values<bf16>(naive::random_normal(K * N, 710 + 2 * ta + tb, 1.0));
      Dev<bf16> da(a), db(b);
      Dev<float> dc(size_t(M * N));  // not read: the first call overwrites
      std::vector<double> ref(size_t(M * N), 0.0);
      for (int rep = 0; rep < 3; ++rep) {
        cuda::gemm_bf16_f32(ta, tb, M, N, K, 0.5, da.get(), db.get(), rep == 0 ? 0.0 : 1.0, dc.get(), nullptr);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k)
              s += double(ta ? a[size_t(k * M + m)] : a[size_t(m * K + k)]) *
                   double(tb ? b[size_t(n * K + k)] : b[size_t(k * N + n)]);
            ref[size_t(m * N + n)] += 0.5 * s;
          }
      }
      const auto got = dc.download();
      test::check_close(widen(got), ref, 1e-4);
    }
}
