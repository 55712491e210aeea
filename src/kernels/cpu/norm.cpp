// CPU normalisation kernels over the last dim: layernorm, RMSNorm (Hugging Face LlamaRMSNorm) and
// softmax. Knows nothing of graphs.
//
// Rows are independent and split over OpenMP threads. Row statistics (mean, variance, mean square,
// softmax sum) are accumulated in double for every T, with a two-pass variance, so float results
// match a float64 reference to rounding. The f32 row work is compiled per ISA (AVX-512 runs the
// double arithmetic 8 lanes wide) and its sums are `omp simd` reductions (one partial per lane):
// on the Zen 4 VM the GPT-2 tiny step's layernorm backward fell from 3.9 to 2.2–2.6 ms.
//
// Backward: the input gradients recompute each row's statistics from x (nothing is saved by the
// forward) and are again split by rows. The parameter gradients sum over rows in fixed row chunks
// (detail::sum_row_blocks) into double partials combined in chunk order, so dw and db do not depend
// on the thread count. The one-pass layernorm_backward (what GPT-2 runs) adds a row's terms of dw
// and db while the row is in cache from its dx, a chunk of whole rows per task: x and dy are read
// once. The separate parameter kernels compute the row statistics into [rows] arrays first.
#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "kernels/cpu/vec16.h"
#include "tensor/check.h"

namespace autosp::cpu {

namespace {

constexpr int64_t kGrain = 1 << 14;  // elements below which a kernel runs on one thread

// ---- one row --------------------------------------------------------------------------------
//
// Each kernel's work on one row [C] is an always-inlined template. The f32 kernels call it through
// a wrapper compiled per ISA (AUTOSP_VEC16_CLONES: AVX-512, AVX2, the baseline), so that on an
// AVX-512 machine the double arithmetic runs 8 lanes wide; the sums are `omp simd` reductions, which
// let the compiler keep one partial sum per lane, except the f32 row statistics (sums8 below, four
// vectors of partials). Still in double for every T.

// The f32 rows' sums in double over explicit vectors: 8 lanes (f64x8) and 4 accumulators, so a
// row's additions are 4 independent chains instead of one (an `omp simd` reduction keeps a single
// vector of partials, and its C/8 dependent adds left the short rows of GPT-2 waiting on add
// latency). sums8<K>(C, f, total) computes K sums at once: f(c, n, acc) adds the terms of the
// columns [c, c + n), n ≤ 8, into acc[0..K); load8 reads n floats widened, the other lanes set to a
// `fill` chosen so that they add 0. The lanes and accumulators are added in a fixed order: the
// result depends on C alone, never on the thread count.
using f32x8 = float __attribute__((vector_size(32)));
using f64x8 = double __attribute__((vector_size(64)));
[[gnu::always_inline]] inline f64x8 load8(const float* p, int64_t n, double fill) {
  if (n == 8) {
    f32x8 v;
    std::memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, f64x8);
  }
  f64x8 v = f64x8{} + fill;
  for (int64_t i = 0; i < n; ++i) v[i] = double(p[i]);
  return v;
}
template <int K, class F>
[[gnu::always_inline]] inline void sums8(int64_t C, F f, double (&total)[K]) {
  f64x8 s[4][K] = {};
  int64_t c = 0;
  for (; c + 32 <= C; c += 32)
    for (int u = 0; u < 4; ++u) f(c + 8 * u, int64_t(8), s[u]);
  for (; c < C; c += 8) f(c, std::min<int64_t>(8, C - c), s[0]);
  for (int k = 0; k < K; ++k) {
    const f64x8 t = (s[0][k] + s[1][k]) + (s[2][k] + s[3][k]);
    total[k] = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  }
}

// The forward's statistics of one row x [C]: mean (0 for RMSNorm) and rstd, in double.
template <class T>
[[gnu::always_inline]] inline void layernorm_stats(const T* x, int64_t C, double eps, double& mu, double& rs) {
  double s = 0, sq = 0;
  if constexpr (std::is_same_v<T, float>) {
    double t[1];
    sums8<1>(C, [&](int64_t c, int64_t n, f64x8* a) { a[0] += load8(x + c, n, 0.0); }, t);
    s = t[0];
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += double(x[c]);
  }
  const double m = s / double(C);
  if constexpr (std::is_same_v<T, float>) {
    double t[1];
    sums8<1>(C, [&](int64_t c, int64_t n, f64x8* a) {
      const f64x8 d = load8(x + c, n, m) - m;
      a[0] += d * d;
    }, t);
    sq = t[0];
  } else {
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < C; ++c) sq += (double(x[c]) - m) * (double(x[c]) - m);
  }
  mu = m;
  rs = 1.0 / std::sqrt(sq / double(C) + eps);
}
template <class T>
[[gnu::always_inline]] inline double rmsnorm_rstd(const T* x, int64_t C, double eps) {
  double sq = 0;
  if constexpr (std::is_same_v<T, float>) {
    double t[1];
    sums8<1>(C, [&](int64_t c, int64_t n, f64x8* a) {
      const f64x8 v = load8(x + c, n, 0.0);
      a[0] += v * v;
    }, t);
    sq = t[0];
  } else {
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < C; ++c) sq += double(x[c]) * double(x[c]);
  }
  return 1.0 / std::sqrt(sq / double(C) + eps);
}
// Either norm's statistics: layernorm's, or RMSNorm's (`rms`: mu = 0).
template <class T>
[[gnu::always_inline]] inline void row_stats(const T* x, int64_t C, double eps, bool rms, double& mu, double& rs) {
  if (rms) {
    mu = 0;
    rs = rmsnorm_rstd(x, C, eps);
  } else {
    layernorm_stats(x, C, eps, mu, rs);
  }
}

// y = norm(x) · w (+ b) for one row; returns the statistics. RMSNorm when `rms` (mu = 0, no b).
template <class T>
[[gnu::always_inline]] inline void norm_row(const T* x, const T* w, const T* b, T* y, int64_t C, double eps, bool rms,
                                            double& mu, double& rs) {
  row_stats(x, C, eps, rms, mu, rs);
  const double m = mu, r = rs;
  if (b != nullptr) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = T((double(x[c]) - m) * r * double(w[c]) + double(b[c]));
  } else {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = T((double(x[c]) - m) * r * double(w[c]));
  }
}

// s = x + r, or x + (r + rb) (added in T, like the add kernels), then norm_row over s.
template <class T>
[[gnu::always_inline]] inline void add_norm_row(const T* x, const T* r, const T* rb, const T* w, const T* b, T* y,
                                                T* s, int64_t C, double eps, bool rms) {
  if (rb) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const T t = r[c] + rb[c];  // the bias add's rounding
      s[c] = x[c] + t;
    }
  } else {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) s[c] = x[c] + r[c];  // the row stays in cache for the norm
  }
  double mu, rs;
  norm_row(s, w, b, y, C, eps, rms, mu, rs);
}

// Layernorm's dx of one row from its statistics mu, rs. With `acc` (not null) the row's terms of
// the parameter sums are added while it is in cache: dw's acc[c] += dy[c] · xhat[c] and db's
// acc[C + c] += dy[c], the values norm_params_row adds (the one-pass layernorm_backward).
template <class T>
[[gnu::always_inline]] inline void layernorm_backward_row_from(const T* dy, const T* x, const T* w, T* dx, int64_t C,
                                                               double mu, double rs, double* acc) {
  double sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
  for (int64_t c = 0; c < C; ++c) {
    const double g = double(dy[c]) * double(w[c]);
    sg += g;
    sgx += g * (double(x[c]) - mu);
  }
  const double mean_g = sg / double(C), mean_gx = sgx * rs / double(C);
  if (acc == nullptr) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (double(x[c]) - mu) * rs;
      dx[c] = T(rs * (double(dy[c]) * double(w[c]) - mean_g - xhat * mean_gx));
    }
    return;
  }
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const double xhat = (double(x[c]) - mu) * rs;
    dx[c] = T(rs * (double(dy[c]) * double(w[c]) - mean_g - xhat * mean_gx));
    acc[c] += double(dy[c]) * xhat;
    acc[C + c] += double(dy[c]);
  }
}

// dx of one row: layernorm dx = rs · (g - mean(g) - xhat · mean(g · xhat)), g = dy · w; RMSNorm
// (`rms`) dx = rs · g - x · rs³ · mean(g · x).
template <class T>
[[gnu::always_inline]] inline void norm_backward_row(const T* dy, const T* x, const T* w, T* dx, int64_t C, double eps,
                                                     bool rms) {
  if (rms) {
    const double rs = rmsnorm_rstd(x, C, eps);
    double sgx = 0;
#pragma omp simd reduction(+ : sgx)
    for (int64_t c = 0; c < C; ++c) sgx += double(dy[c]) * double(w[c]) * double(x[c]);
    const double k = rs * rs * rs * sgx / double(C);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dx[c] = T(rs * double(dy[c]) * double(w[c]) - double(x[c]) * k);
    return;
  }
  double mu, rs;
  layernorm_stats(x, C, eps, mu, rs);
  layernorm_backward_row_from(dy, x, w, dx, C, mu, rs, nullptr);
}

// acc[c] += dy[c] · (x[c] - mu) · rs over [c0, c1), and db's acc[C + c] += dy[c] when `with_db`.
template <class T>
[[gnu::always_inline]] inline void norm_params_row(const T* dy, const T* x, double mu, double rs, int64_t c0,
                                                   int64_t c1, int64_t C, bool with_db, double* acc) {
#pragma omp simd
  for (int64_t c = c0; c < c1; ++c) acc[c] += double(dy[c]) * ((double(x[c]) - mu) * rs);
  if (with_db) {
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) acc[C + c] += double(dy[c]);
  }
}

// The f32 rows, one clone per ISA; T = double runs the templates as they are (the gradient-check
// dtype, not a speed path).
AUTOSP_VEC16_CLONES void norm_row_f32(const float* x, const float* w, const float* b, float* y, int64_t C, double eps,
                                      bool rms, double& mu, double& rs) {
  norm_row(x, w, b, y, C, eps, rms, mu, rs);
}
AUTOSP_VEC16_CLONES void add_norm_row_f32(const float* x, const float* r, const float* rb, const float* w,
                                          const float* b, float* y, float* s, int64_t C, double eps, bool rms) {
  add_norm_row(x, r, rb, w, b, y, s, C, eps, rms);
}
AUTOSP_VEC16_CLONES void norm_backward_row_f32(const float* dy, const float* x, const float* w, float* dx, int64_t C,
                                               double eps, bool rms) {
  norm_backward_row(dy, x, w, dx, C, eps, rms);
}
// Layernorm's whole backward of one row (the one-pass layernorm_backward): statistics, dx, and the
// parameter sums' terms into acc.
AUTOSP_VEC16_CLONES void layernorm_backward_row_sums_f32(const float* dy, const float* x, const float* w, float* dx,
                                                         int64_t C, double eps, double* acc) {
  double mu, rs;
  layernorm_stats(x, C, eps, mu, rs);
  layernorm_backward_row_from(dy, x, w, dx, C, mu, rs, acc);
}
AUTOSP_VEC16_CLONES void norm_stats_f32(const float* x, int64_t C, double eps, bool rms, double& mu, double& rs) {
  row_stats(x, C, eps, rms, mu, rs);
}
AUTOSP_VEC16_CLONES void norm_params_row_f32(const float* dy, const float* x, double mu, double rs, int64_t c0,
                                             int64_t c1, int64_t C, bool with_db, double* acc) {
  norm_params_row(dy, x, mu, rs, c0, c1, C, with_db, acc);
}

template <class T>
void norm_rows(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows, int64_t C, double eps,
               bool rms) {
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    double mu, rs;
    if constexpr (std::is_same_v<T, float>) norm_row_f32(x + r * C, w, b, y + r * C, C, eps, rms, mu, rs);
    else norm_row(x + r * C, w, b, y + r * C, C, eps, rms, mu, rs);
    if (mean != nullptr) mean[r] = T(mu);
    if (rstd != nullptr) rstd[r] = T(rs);
  }
}

template <class T>
void norm_stats(const T* x, int64_t C, double eps, bool rms, double& mu, double& rs) {
  if constexpr (std::is_same_v<T, float>) norm_stats_f32(x, C, eps, rms, mu, rs);
  else row_stats(x, C, eps, rms, mu, rs);
}

template <class T>
void norm_backward_rows(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps, bool rms) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, rms ? "rmsnorm_backward" : "layernorm_backward", " rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<T, float>) norm_backward_row_f32(dy + r * C, x + r * C, w, dx + r * C, C, eps, rms);
    else norm_backward_row(dy + r * C, x + r * C, w, dx + r * C, C, eps, rms);
  }
}

// dw (and db when not null; never for RMSNorm) summed over rows, deterministically (sum_row_blocks):
// each row's mu and rs computed first into [rows] arrays. Layernorm's rows are cut into the chunks
// of whole rows that the one-pass layernorm_backward uses, so the two forms give the same bits;
// RMSNorm's chunks may also split the columns.
template <class T>
void norm_params(const T* dy, const T* x, T* dw, T* db, int64_t rows, int64_t C, double eps, bool rms) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, rms ? "rmsnorm_backward" : "layernorm_backward", " rows ", rows, " C ", C);
  std::vector<double> stats(static_cast<size_t>(2 * rows));  // [mu | rs]
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) norm_stats(x + r * C, C, eps, rms, stats[size_t(r)], stats[size_t(rows + r)]);
  const double* mu = stats.data();         // [rows]
  const double* rs = stats.data() + rows;  // [rows]
  const bool with_db = db != nullptr;
  std::vector<double> out(static_cast<size_t>((with_db ? 2 : 1) * C));  // [dw | db]
  detail::sum_row_blocks(rows, C, with_db ? 2 : 1, 1, !rms, out.data(),
                         [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, double* acc) {
                           for (int64_t r = r0; r < r1; ++r) {
                             if constexpr (std::is_same_v<T, float>)
                               norm_params_row_f32(dy + r * C, x + r * C, mu[r], rs[r], c0, c1, C, with_db, acc);
                             else norm_params_row(dy + r * C, x + r * C, mu[r], rs[r], c0, c1, C, with_db, acc);
                           }
                         });
  for (int64_t c = 0; c < C; ++c) dw[c] = T(out[c]);
  if (with_db)
    for (int64_t c = 0; c < C; ++c) db[c] = T(out[C + c]);
}

}  // namespace

template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows,
                       int64_t C, double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "layernorm rows ", rows, " C ", C);
  norm_rows(x, w, b, y, mean, rstd, rows, C, eps, false);
}

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t C, double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "rmsnorm rows ", rows, " C ", C);
  norm_rows(x, w, static_cast<const T*>(nullptr), y, static_cast<T*>(nullptr), rstd, rows, C, eps, true);
}

template <class T>
void add_norm_forward(const T* x, const T* r, const T* rb, const T* w, const T* b, T* y, T* s, int64_t rows,
                      int64_t C, double eps, bool rms) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, rms ? "add_rmsnorm" : "add_layernorm", " rows ", rows, " C ", C);
  const T* bias = rms ? nullptr : b;
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t i = 0; i < rows; ++i) {
    if constexpr (std::is_same_v<T, float>)
      add_norm_row_f32(x + i * C, r + i * C, rb, w, bias, y + i * C, s + i * C, C, eps, rms);
    else add_norm_row(x + i * C, r + i * C, rb, w, bias, y + i * C, s + i * C, C, eps, rms);
  }
}

template <class T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t C) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "softmax rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;  // [C]; y may alias x, each element is read before it is written
    T* yr = y + r * C;
    T m = xr[0];
    for (int64_t c = 1; c < C; ++c) m = std::max(m, xr[c]);
    for (int64_t c = 0; c < C; ++c) yr[c] = std::exp(xr[c] - m);
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += double(yr[c]);
    const double inv = 1.0 / sum;
    for (int64_t c = 0; c < C; ++c) yr[c] = T(double(yr[c]) * inv);
  }
}

// ---- backward ----------------------------------------------------------------------------------

template <class T>
void layernorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps) {
  norm_backward_rows(dy, x, w, dx, rows, C, eps, false);
}

template <class T>
void layernorm_backward_params(const T* dy, const T* x, T* dw, T* db, int64_t rows, int64_t C, double eps) {
  norm_params(dy, x, dw, db, rows, C, eps, false);
}

// One pass of rows: each row's statistics, dx, and its terms of dw and db while the row is in cache
// (sum_row_blocks' fixed chunks of whole rows, so dw and db do not depend on the thread count).
// x and dy are read once; the two-call form reads them twice and computes the statistics twice.
template <class T>
void layernorm_backward(const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, int64_t rows, int64_t C,
                        double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "layernorm_backward rows ", rows, " C ", C);
  std::vector<double> out(static_cast<size_t>(2 * C));  // [dw | db]
  detail::sum_row_blocks(rows, C, 2, 1, true, out.data(), [&](int64_t r0, int64_t r1, int64_t, int64_t, double* acc) {
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (std::is_same_v<T, float>) {
        layernorm_backward_row_sums_f32(dy + r * C, x + r * C, w, dx + r * C, C, eps, acc);
      } else {
        double mu, rs;
        layernorm_stats(x + r * C, C, eps, mu, rs);
        layernorm_backward_row_from(dy + r * C, x + r * C, w, dx + r * C, C, mu, rs, acc);
      }
    }
  });
  for (int64_t c = 0; c < C; ++c) dw[c] = T(out[c]);
  for (int64_t c = 0; c < C; ++c) db[c] = T(out[C + c]);
}

template <class T>
void rmsnorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps) {
  norm_backward_rows(dy, x, w, dx, rows, C, eps, true);
}

template <class T>
void rmsnorm_backward_weight(const T* dy, const T* x, T* dw, int64_t rows, int64_t C, double eps) {
  norm_params(dy, x, dw, static_cast<T*>(nullptr), rows, C, eps, true);
}

template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t C) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "softmax_backward rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * C, *yr = y + r * C;  // [C]; dx may alias dy
    T* dxr = dx + r * C;
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < C; ++c) dot += double(dyr[c]) * double(yr[c]);
    for (int64_t c = 0; c < C; ++c) dxr[c] = T(double(yr[c]) * (double(dyr[c]) - dot));
  }
}

template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*,
                                       float*, int64_t, int64_t, double);
template void layernorm_forward<double>(const double*, const double*, const double*, double*,
                                        double*, double*, int64_t, int64_t, double);
template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t,
                                     double);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, int64_t,
                                      int64_t, double);
template void add_norm_forward<float>(const float*, const float*, const float*, const float*, const float*, float*, float*,
                                      int64_t, int64_t, double, bool);
template void add_norm_forward<double>(const double*, const double*, const double*, const double*, const double*, double*,
                                       double*, int64_t, int64_t, double, bool);
template void softmax_forward<float>(const float*, float*, int64_t, int64_t);
template void softmax_forward<double>(const double*, double*, int64_t, int64_t);

#define AUTOSP_INSTANTIATE_BACKWARD(T)                                                              \
  template void layernorm_backward_input<T>(const T*, const T*, const T*, T*, int64_t, int64_t, double); \
  template void layernorm_backward_params<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);    \
  template void layernorm_backward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, double); \
  template void rmsnorm_backward_input<T>(const T*, const T*, const T*, T*, int64_t, int64_t, double);   \
  template void rmsnorm_backward_weight<T>(const T*, const T*, T*, int64_t, int64_t, double);           \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);
AUTOSP_INSTANTIATE_BACKWARD(float)
AUTOSP_INSTANTIATE_BACKWARD(double)
#undef AUTOSP_INSTANTIATE_BACKWARD

}  // namespace autosp::cpu
