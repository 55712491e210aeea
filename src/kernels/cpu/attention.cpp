// CPU scaled-dot-product attention forward, flash-style. Knows nothing of graphs.
//
// Work is split over OpenMP threads by (b, h, query block). For one query block, keys are visited
// in blocks of kBlockK with an online softmax: per query row a running max m and running sum l;
// when a block raises the max, the row's sum and output accumulator are rescaled by exp(m_old -
// m_new). Per-thread scratch is one score tile [BQ, BK], one accumulator [BQ, D] and m, l [BQ];
// no Sq×Skv matrix exists. With causal masking, key blocks past the block's last visible key are
// never visited, and only the blocks on the diagonal apply a per-row mask.
//
// The two tile products, S = Q·Kᵀ and O += P·V, are single-threaded cblas calls: the query block
// height is chosen so BQ·BK·D ≤ kTileMNK, where OpenBLAS runs in the calling thread (see
// matmul.cpp), so the OpenMP threads each run their own GEMMs without oversubscription.
//
// A query row that sees no key at all (causal with Sq > Skv, or Skv == 0) gets o = 0, lse = -inf.
#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/check.h"

namespace autosp::cpu {

namespace {

constexpr int64_t kBlockK = 64;              // keys per block
constexpr int64_t kMaxBlockQ = 64;           // queries per block, at most
constexpr int64_t kTileMNK = 65536 * 4;      // tile GEMM size OpenBLAS keeps single-threaded

// C[M×N] (ldc) = A[M×K] (lda) · B[N×K]ᵀ (ldb)
void gemm_abt(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(M), blasint(N), blasint(K), 1.0f, a,
              blasint(lda), b, blasint(ldb), 0.0f, c, blasint(ldc));
}
void gemm_abt(int64_t M, int64_t N, int64_t K, const double* a, int64_t lda, const double* b,
              int64_t ldb, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(M), blasint(N), blasint(K), 1.0, a,
              blasint(lda), b, blasint(ldb), 0.0, c, blasint(ldc));
}

// C[M×N] (ldc) += A[M×K] (lda) · B[K×N] (ldb)
void gemm_acc(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(M), blasint(N), blasint(K), 1.0f,
              a, blasint(lda), b, blasint(ldb), 1.0f, c, blasint(ldc));
}
void gemm_acc(int64_t M, int64_t N, int64_t K, const double* a, int64_t lda, const double* b,
              int64_t ldb, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(M), blasint(N), blasint(K), 1.0, a,
              blasint(lda), b, blasint(ldb), 1.0, c, blasint(ldc));
}

}  // namespace

template <class T>
void sdpa_forward(const T* q, const T* k, const T* v, T* o, T* lse, int64_t B, int64_t N, int64_t Nkv,
                  int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal) {
  AUTOSP_ASSERT(B >= 0 && Sq >= 0 && Skv >= 0 && D > 0, "sdpa sizes B ", B, " Sq ", Sq, " Skv ",
                Skv, " D ", D);
  AUTOSP_ASSERT(Nkv > 0 && N % Nkv == 0, "sdpa heads N ", N, " Nkv ", Nkv);
  AUTOSP_ASSERT(D <= std::numeric_limits<int>::max(), "sdpa head dim ", D);
  const int64_t group = N / Nkv;  // query heads per kv head
  const int64_t BK = kBlockK;
  const int64_t BQ = std::clamp<int64_t>(kTileMNK / (BK * D), 1, kMaxBlockQ);
  const int64_t nqb = (Sq + BQ - 1) / BQ;
  const int64_t shift = Skv - Sq;  // causal: query i sees keys j ≤ i + shift (bottom-right)
  const T sc = T(scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();

#pragma omp parallel
  {
    std::vector<T> s(static_cast<size_t>(BQ * BK));    // [BQ, BK] scores, then probabilities
    std::vector<T> acc(static_cast<size_t>(BQ * D));   // [BQ, D] unnormalised output
    std::vector<T> m(static_cast<size_t>(BQ));         // [BQ] running max of scaled scores
    std::vector<double> l(static_cast<size_t>(BQ));    // [BQ] running Σ exp(score - m)

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * N * nqb; ++task) {
      // Late query blocks carry the most keys under causal masking: hand them out first.
      const int64_t qb = nqb - 1 - task % nqb, bh = task / nqb;
      const int64_t b = bh / N, h = bh % N;
      const int64_t i0 = qb * BQ, bq = std::min(BQ, Sq - i0);
      const T* qp = q + (bh * Sq + i0) * D;                    // [bq, D]
      const T* kp = k + (b * Nkv + h / group) * Skv * D;       // [Skv, D]
      const T* vp = v + (b * Nkv + h / group) * Skv * D;       // [Skv, D]
      // Keys past kend are masked for every row of this block.
      const int64_t kend = causal ? std::clamp<int64_t>(i0 + bq + shift, 0, Skv) : Skv;

      std::fill(m.begin(), m.begin() + bq, neg_inf);
      std::fill(l.begin(), l.begin() + bq, 0.0);
      std::fill(acc.begin(), acc.begin() + bq * D, T(0));

      for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        const int64_t bk = std::min(BK, kend - j0);
        // s [bq, bk] = q [bq, D] · k[j0 : j0+bk]ᵀ
        gemm_abt(bq, bk, D, qp, D, kp + j0 * D, D, s.data(), BK);
        const bool masked = causal && j0 + bk - 1 > i0 + shift;  // some row misses some key
        for (int64_t i = 0; i < bq; ++i) {
          T* si = s.data() + i * BK;
          const int64_t lim = masked ? std::clamp<int64_t>(i0 + i + shift + 1 - j0, 0, bk) : bk;
          T bmax = neg_inf;
          for (int64_t j = 0; j < lim; ++j) {
            si[j] *= sc;
            bmax = std::max(bmax, si[j]);
          }
          for (int64_t j = lim; j < bk; ++j) si[j] = T(0);
          if (lim == 0) continue;  // the row sees nothing here: p = 0, state unchanged
          const T m_new = std::max(m[i], bmax);
          const T alpha = std::exp(m[i] - m_new);  // 0 on the row's first visible block
          double psum = 0;
          for (int64_t j = 0; j < lim; ++j) {
            si[j] = std::exp(si[j] - m_new);
            psum += double(si[j]);
          }
          l[i] = l[i] * double(alpha) + psum;
          m[i] = m_new;
          if (alpha != T(1)) {
            T* ai = acc.data() + i * D;
            for (int64_t d = 0; d < D; ++d) ai[d] *= alpha;
          }
        }
        // acc [bq, D] += p [bq, bk] · v[j0 : j0+bk] [bk, D]
        gemm_acc(bq, D, bk, s.data(), BK, vp + j0 * D, D, acc.data(), D);
      }

      T* op = o + (bh * Sq + i0) * D;  // [bq, D]
      for (int64_t i = 0; i < bq; ++i) {
        const double inv = l[i] > 0 ? 1.0 / l[i] : 0.0;
        for (int64_t d = 0; d < D; ++d) op[i * D + d] = T(double(acc[i * D + d]) * inv);
        if (lse != nullptr)
          lse[bh * Sq + i0 + i] = l[i] > 0 ? T(double(m[i]) + std::log(l[i])) : neg_inf;
      }
    }
  }
}

template void sdpa_forward<float>(const float*, const float*, const float*, float*, float*, int64_t,
                                  int64_t, int64_t, int64_t, int64_t, int64_t, double, bool);
template void sdpa_forward<double>(const double*, const double*, const double*, double*, double*,
                                   int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool);

}  // namespace autosp::cpu
