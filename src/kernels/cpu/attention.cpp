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
//
// Backward (FlashAttention-2 from the saved lse), in three parallel passes with no atomics:
//   0. Δ [B, N, Sq] = Σ_d dout · o, accumulated in double.
//   1. dk, dv: parallel over (b, kv head, key block). A task owns its [bk, D] slices of dk and dv
//      and loops over the query heads of its GQA group and the query blocks that see the key block,
//      recomputing per tile P = exp(scale · q·kᵀ - lse) and dS = P ∘ (dout·vᵀ - Δ), then
//      dv += Pᵀ·dout and dk += scale · dSᵀ·q.
//   2. dq: parallel over (b, head, query block). A task owns its [bq, D] slice of dq and loops over
//      the visible key blocks, recomputing P and dS, then dq += scale · dS·k.
// Pass 2 recomputes two of pass 1's tile GEMMs (7 GEMMs per tile in all, against FlashAttention-2's
// 5 with atomic dq): the price of a race-free dq whose summation order is fixed by the sizes, so
// results are the same for any thread count. Scratch is two [BQ, BK] tiles per thread; fully
// masked tiles are skipped, only diagonal tiles apply a per-row mask, and a row with lse = -inf
// (it sees no key) has P = 0, so it adds nothing and gets dq = 0.
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

// C[M×N] (ldc) = alpha · op(A) · op(B) + beta · C; op(A) is M×K, op(B) is K×N (row-major).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(M),
              blasint(N), blasint(K), alpha, a, blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
}
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(M),
              blasint(N), blasint(K), alpha, a, blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
}

// Query rows per block for head dim D: BQ·BK·D ≤ kTileMNK keeps each tile GEMM single-threaded.
int64_t query_block(int64_t D) { return std::clamp<int64_t>(kTileMNK / (kBlockK * D), 1, kMaxBlockQ); }

// One backward tile: queries [i0, i0+bq) of one head against keys [j0, j0+bk) of its kv head.
//   p [bq, BK] = exp(scale · q·kᵀ - lse), 0 where masked or where lse = -inf
//   ds [bq, BK] = p ∘ (dout·vᵀ - Δ)
// q, dout: [bq, D] (ld D); k, v: [bk, D] (ld D); lse, delta: [bq]. `shift` = Skv - Sq.
template <class T>
void backward_tile(const T* q, const T* dout, const T* k, const T* v, const T* lse, const T* delta, int64_t i0,
                   int64_t bq, int64_t j0, int64_t bk, int64_t D, T scale, bool causal, int64_t shift, T* p,
                   T* ds) {
  const int64_t BK = kBlockK;
  gemm(false, true, bq, bk, D, T(1), q, D, k, D, T(0), p, BK);      // p = q · kᵀ
  gemm(false, true, bq, bk, D, T(1), dout, D, v, D, T(0), ds, BK);  // ds = dout · vᵀ
  const bool masked = causal && j0 + bk - 1 > i0 + shift;  // some row misses some key
  for (int64_t i = 0; i < bq; ++i) {
    T* pi = p + i * BK;
    T* di = ds + i * BK;
    int64_t lim = masked ? std::clamp<int64_t>(i0 + i + shift + 1 - j0, 0, bk) : bk;
    if (lse[i] == -std::numeric_limits<T>::infinity()) lim = 0;  // the row sees no key at all
    const T li = lse[i], dl = delta[i];
    for (int64_t j = 0; j < lim; ++j) pi[j] = std::exp(pi[j] * scale - li);
    for (int64_t j = lim; j < bk; ++j) pi[j] = T(0);
    for (int64_t j = 0; j < bk; ++j) di[j] = pi[j] * (di[j] - dl);
  }
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
  const int64_t BQ = query_block(D);
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

template <class T>
void sdpa_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk,
                   T* dv, int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale,
                   bool causal) {
  AUTOSP_ASSERT(B >= 0 && Sq >= 0 && Skv >= 0 && D > 0, "sdpa_backward sizes B ", B, " Sq ", Sq, " Skv ", Skv,
                " D ", D);
  AUTOSP_ASSERT(Nkv > 0 && N % Nkv == 0, "sdpa_backward heads N ", N, " Nkv ", Nkv);
  AUTOSP_ASSERT(D <= std::numeric_limits<int>::max(), "sdpa_backward head dim ", D);
  const int64_t group = N / Nkv;  // query heads per kv head
  const int64_t BK = kBlockK, BQ = query_block(D);
  const int64_t nqb = (Sq + BQ - 1) / BQ, nkb = (Skv + BK - 1) / BK;
  const int64_t shift = Skv - Sq;  // causal: query i sees keys j ≤ i + shift (bottom-right)
  const T sc = T(scale);

  // Pass 0: Δ [B, N, Sq] = rowsum(dout ∘ o).
  std::vector<T> delta(static_cast<size_t>(B * N * Sq));
#pragma omp parallel for schedule(static) if (B * N * Sq * D > (1 << 15))
  for (int64_t r = 0; r < B * N * Sq; ++r) {
    const T *dr = dout + r * D, *orow = o + r * D;  // [D]
    double s[4] = {0, 0, 0, 0};
    int64_t d = 0;
    for (; d + 4 <= D; d += 4)
      for (int u = 0; u < 4; ++u) s[u] += double(dr[d + u]) * double(orow[d + u]);
    for (; d < D; ++d) s[0] += double(dr[d]) * double(orow[d]);
    delta[r] = T((s[0] + s[1]) + (s[2] + s[3]));
  }

#pragma omp parallel
  {
    std::vector<T> p(static_cast<size_t>(BQ * BK)), ds(static_cast<size_t>(BQ * BK));  // [BQ, BK] tiles

    // Pass 1: dk, dv [B, Nkv, Skv, D], one key block per task. Early key blocks see the most
    // queries under causal masking, and come first.
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t task = 0; task < B * Nkv * nkb; ++task) {
      const int64_t kb = task % nkb, bkv = task / nkb, b = bkv / Nkv;
      const int64_t j0 = kb * BK, bk = std::min(BK, Skv - j0);
      const T* kp = k + (bkv * Skv + j0) * D;  // [bk, D]
      const T* vp = v + (bkv * Skv + j0) * D;
      T* dkp = dk + (bkv * Skv + j0) * D;
      T* dvp = dv + (bkv * Skv + j0) * D;
      std::fill(dkp, dkp + bk * D, T(0));
      std::fill(dvp, dvp + bk * D, T(0));
      // Queries i see this block iff i + shift ≥ j0.
      const int64_t qb0 = causal ? std::max<int64_t>(j0 - shift, 0) / BQ : 0;
      for (int64_t h = (bkv % Nkv) * group; h < (bkv % Nkv + 1) * group; ++h) {
        const int64_t bh = b * N + h;
        for (int64_t qb = qb0; qb < nqb; ++qb) {
          const int64_t i0 = qb * BQ, bq = std::min(BQ, Sq - i0);
          const T* qp = q + (bh * Sq + i0) * D;     // [bq, D]
          const T* dop = dout + (bh * Sq + i0) * D;  // [bq, D]
          backward_tile(qp, dop, kp, vp, lse + bh * Sq + i0, delta.data() + bh * Sq + i0, i0, bq, j0, bk, D, sc,
                        causal, shift, p.data(), ds.data());
          gemm(true, false, bk, D, bq, T(1), p.data(), BK, dop, D, T(1), dvp, D);  // dv += pᵀ · dout
          gemm(true, false, bk, D, bq, sc, ds.data(), BK, qp, D, T(1), dkp, D);    // dk += scale · dsᵀ · q
        }
      }
    }

    // Pass 2: dq [B, N, Sq, D], one query block per task; late blocks (most keys) first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * N * nqb; ++task) {
      const int64_t qb = nqb - 1 - task % nqb, bh = task / nqb;
      const int64_t b = bh / N, h = bh % N;
      const int64_t i0 = qb * BQ, bq = std::min(BQ, Sq - i0);
      const T* qp = q + (bh * Sq + i0) * D;     // [bq, D]
      const T* dop = dout + (bh * Sq + i0) * D;  // [bq, D]
      const T* kp = k + (b * Nkv + h / group) * Skv * D;  // [Skv, D]
      const T* vp = v + (b * Nkv + h / group) * Skv * D;
      T* dqp = dq + (bh * Sq + i0) * D;  // [bq, D]
      std::fill(dqp, dqp + bq * D, T(0));
      const int64_t kend = causal ? std::clamp<int64_t>(i0 + bq + shift, 0, Skv) : Skv;
      for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        const int64_t bk = std::min(BK, kend - j0);
        backward_tile(qp, dop, kp + j0 * D, vp + j0 * D, lse + bh * Sq + i0, delta.data() + bh * Sq + i0, i0, bq,
                      j0, bk, D, sc, causal, shift, p.data(), ds.data());
        gemm(false, false, bq, D, bk, sc, ds.data(), BK, kp + j0 * D, D, T(1), dqp, D);  // dq += scale · ds · k
      }
    }
  }
}

template void sdpa_forward<float>(const float*, const float*, const float*, float*, float*, int64_t,
                                  int64_t, int64_t, int64_t, int64_t, int64_t, double, bool);
template void sdpa_forward<double>(const double*, const double*, const double*, double*, double*,
                                   int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool);
template void sdpa_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                   const float*, float*, float*, float*, int64_t, int64_t, int64_t, int64_t,
                                   int64_t, int64_t, double, bool);
template void sdpa_backward<double>(const double*, const double*, const double*, const double*, const double*,
                                    const double*, double*, double*, double*, int64_t, int64_t, int64_t, int64_t,
                                    int64_t, int64_t, double, bool);

template <class T>
void causal_mask(const T* x, T* y, int64_t batch, int64_t Sq, int64_t Skv, T value) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < batch * Sq; ++r) {
    const int64_t i = r % Sq;
    const int64_t last = std::min(Skv, std::max<int64_t>(0, i + (Skv - Sq) + 1));  // keys [0, last) are visible
    const T* xr = x + r * Skv;
    T* yr = y + r * Skv;
    for (int64_t j = 0; j < last; ++j) yr[j] = xr[j];
    for (int64_t j = last; j < Skv; ++j) yr[j] = value;
  }
}

template void causal_mask<float>(const float*, float*, int64_t, int64_t, int64_t, float);
template void causal_mask<double>(const double*, double*, int64_t, int64_t, int64_t, double);

}  // namespace autosp::cpu
