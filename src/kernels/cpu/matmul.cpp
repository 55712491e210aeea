// CPU GEMM launchers: batched row-major GEMM on OpenBLAS, and the thread count shared by OpenMP
// regions and OpenBLAS. Knows nothing of graphs or tensors.
//
// Threading: a large GEMM is one cblas call per batch entry, threaded inside OpenBLAS. A batch of
// mid-sized GEMMs (kMinBatchMNK ≤ M·N·K ≤ kSmallMNK) is spread over the batch with OpenMP instead:
// at that size OpenBLAS 0.3.x runs single-threaded in the calling thread (its interface/gemm.c
// threshold is 65536 · GEMM_MULTITHREAD_THRESHOLD = 65536 · 4) and concurrent calls are safe.
// Tiny GEMMs stay sequential: per-call overhead and OpenBLAS's shared buffer pool make them slower
// when issued from several threads at once.
//
// The build links OpenBLAS's OpenMP variant (libopenblas-openmp-dev) so that BLAS and our kernels
// share one thread pool: the pthread build keeps a second pool spinning beside OpenMP's, and on a
// machine with few cores an OpenMP kernel right after a threaded GEMM ran 1.5–3× slower.
#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "tensor/check.h"

namespace autosp::cpu {

namespace {

constexpr double kSmallMNK = 65536.0 * 4.0;  // largest GEMM OpenBLAS keeps single-threaded
constexpr double kMinBatchMNK = 16384.0;     // smallest GEMM worth a thread of its own

void gemm_one(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, float alpha,
              const float* a, blasint lda, const float* b, blasint ldb, float beta, float* c,
              blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_one(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, double alpha,
              const double* a, blasint lda, const double* b, blasint ldb, double beta, double* c,
              blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, T alpha,
                  const T* a, int64_t stride_a, const T* b, int64_t stride_b, T beta, T* c,
                  int64_t stride_c) {
  AUTOSP_ASSERT(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "gemm sizes ", batch, " ", M, " ", N, " ", K);
  AUTOSP_ASSERT(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX, "gemm dims exceed blasint");
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {  // C = beta · C (BLAS would reject lda = 0); beta == 0 overwrites NaN too
    for (int64_t p = 0; p < batch; ++p) {
      T* cp = c + p * stride_c;
      for (int64_t i = 0; i < M * N; ++i) cp[i] = beta == T(0) ? T(0) : beta * cp[i];
    }
    return;
  }
  // A[b]: M×K (lda K) or stored K×M (lda M); B[b]: K×N (ldb N) or stored N×K (ldb K); C[b]: M×N.
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const blasint lda = blasint(trans_a ? M : K), ldb = blasint(trans_b ? K : N), ldc = blasint(N);
  const double mnk = double(M) * double(N) * double(K);
  // stride_c == 0 accumulates into one C in batch order, so it must stay sequential.
  const bool over_batch = batch > 1 && stride_c != 0 && mnk >= kMinBatchMNK && mnk <= kSmallMNK &&
                          !omp_in_parallel();
  if (over_batch) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < batch; ++p)
      gemm_one(ta, tb, blasint(M), blasint(N), blasint(K), alpha, a + p * stride_a, lda,
               b + p * stride_b, ldb, beta, c + p * stride_c, ldc);
  } else {
    for (int64_t p = 0; p < batch; ++p)
      gemm_one(ta, tb, blasint(M), blasint(N), blasint(K), alpha, a + p * stride_a, lda,
               b + p * stride_b, ldb, beta, c + p * stride_c, ldc);
  }
}

void set_num_threads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

template void gemm_batched<float>(bool, bool, int64_t, int64_t, int64_t, int64_t, float, const float*,
                                  int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm_batched<double>(bool, bool, int64_t, int64_t, int64_t, int64_t, double,
                                   const double*, int64_t, const double*, int64_t, double, double*,
                                   int64_t);

}  // namespace autosp::cpu
