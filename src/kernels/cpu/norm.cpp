// CPU normalisation kernels over the last dim: layernorm, RMSNorm (Hugging Face LlamaRMSNorm) and
// softmax. Knows nothing of graphs.
//
// Rows are independent and split over OpenMP threads. Row statistics (mean, variance, mean square,
// softmax sum) are accumulated in double for every T, with a two-pass variance, so float results
// match a float64 reference to rounding; the per-element maps are plain loops that vectorise.
//
// Backward: the input gradients recompute each row's statistics from x (nothing is saved by the
// forward) and are again split by rows. The parameter gradients sum over rows: row statistics
// are computed once into [rows] arrays, then detail::sum_rows adds fixed row chunks into double
// partials combined in chunk order, so dw and db do not depend on the thread count.
#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "tensor/check.h"

namespace autosp::cpu {

namespace {

constexpr int64_t kGrain = 1 << 14;  // elements below which a kernel runs on one thread

// Σ f(x[c]) in double, with four partial sums so the loop is not one long chain of dependent adds.
template <class T, class F>
double sum_of(const T* x, int64_t n, F f) {
  double s[4] = {0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 4 <= n; c += 4)
    for (int k = 0; k < 4; ++k) s[k] += f(double(x[c + k]));
  for (; c < n; ++c) s[0] += f(double(x[c]));
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Σ_{c < n} f(c) in double, four partial sums.
template <class F>
double sum_idx(int64_t n, F f) {
  double s[4] = {0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 4 <= n; c += 4)
    for (int k = 0; k < 4; ++k) s[k] += f(c + k);
  for (; c < n; ++c) s[0] += f(c);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// The forward's statistics of one row x [C]: mean (0 for RMSNorm) and rstd, in double.
template <class T>
void layernorm_stats(const T* x, int64_t C, double eps, double& mu, double& rs) {
  mu = sum_of(x, C, [](double v) { return v; }) / double(C);
  const double sq = sum_of(x, C, [mu](double v) { return (v - mu) * (v - mu); });
  rs = 1.0 / std::sqrt(sq / double(C) + eps);
}
template <class T>
double rmsnorm_rstd(const T* x, int64_t C, double eps) {
  return 1.0 / std::sqrt(sum_of(x, C, [](double v) { return v * v; }) / double(C) + eps);
}

}  // namespace

template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows,
                       int64_t C, double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "layernorm rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;  // [C]
    T* yr = y + r * C;
    double mu, rs;
    layernorm_stats(xr, C, eps, mu, rs);
    if (b != nullptr) {
      for (int64_t c = 0; c < C; ++c)
        yr[c] = T((double(xr[c]) - mu) * rs * double(w[c]) + double(b[c]));
    } else {
      for (int64_t c = 0; c < C; ++c) yr[c] = T((double(xr[c]) - mu) * rs * double(w[c]));
    }
    if (mean != nullptr) mean[r] = T(mu);
    if (rstd != nullptr) rstd[r] = T(rs);
  }
}

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t C, double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "rmsnorm rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;  // [C]
    T* yr = y + r * C;
    const double rs = rmsnorm_rstd(xr, C, eps);
    for (int64_t c = 0; c < C; ++c) yr[c] = T(double(xr[c]) * rs * double(w[c]));
    if (rstd != nullptr) rstd[r] = T(rs);
  }
}

template <class T>
void add_norm_forward(const T* x, const T* r, const T* w, const T* b, T* y, T* s, int64_t rows, int64_t C,
                      double eps, bool rms) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, rms ? "add_rmsnorm" : "add_layernorm", " rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t i = 0; i < rows; ++i) {
    const T *xr = x + i * C, *rr = r + i * C;  // [C]
    T *sr = s + i * C, *yr = y + i * C;
    for (int64_t c = 0; c < C; ++c) sr[c] = xr[c] + rr[c];  // the row stays in cache for the norm
    if (rms) {
      const double rs = rmsnorm_rstd(sr, C, eps);
      for (int64_t c = 0; c < C; ++c) yr[c] = T(double(sr[c]) * rs * double(w[c]));
      continue;
    }
    double mu, rs;
    layernorm_stats(sr, C, eps, mu, rs);
    if (b != nullptr) {
      for (int64_t c = 0; c < C; ++c) yr[c] = T((double(sr[c]) - mu) * rs * double(w[c]) + double(b[c]));
    } else {
      for (int64_t c = 0; c < C; ++c) yr[c] = T((double(sr[c]) - mu) * rs * double(w[c]));
    }
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
    const double sum = sum_of(yr, C, [](double v) { return v; });
    const double inv = 1.0 / sum;
    for (int64_t c = 0; c < C; ++c) yr[c] = T(double(yr[c]) * inv);
  }
}

// ---- backward ----------------------------------------------------------------------------------

template <class T>
void layernorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "layernorm_backward rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T *xr = x + r * C, *dyr = dy + r * C;  // [C]
    T* dxr = dx + r * C;
    double mu, rs;
    layernorm_stats(xr, C, eps, mu, rs);
    // g = dy · w; mean(g) and mean(g · xhat), xhat = (x - mu) · rs
    const double mean_g = sum_idx(C, [&](int64_t c) { return double(dyr[c]) * double(w[c]); }) / double(C);
    const double mean_gx =
        sum_idx(C, [&](int64_t c) { return double(dyr[c]) * double(w[c]) * (double(xr[c]) - mu); }) * rs /
        double(C);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (double(xr[c]) - mu) * rs;
      dxr[c] = T(rs * (double(dyr[c]) * double(w[c]) - mean_g - xhat * mean_gx));
    }
  }
}

template <class T>
void layernorm_backward_params(const T* dy, const T* x, T* dw, T* db, int64_t rows, int64_t C, double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "layernorm_backward rows ", rows, " C ", C);
  std::vector<double> mu(static_cast<size_t>(rows)), rs(static_cast<size_t>(rows));  // [rows]
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) layernorm_stats(x + r * C, C, eps, mu[r], rs[r]);
  const int nacc = db != nullptr ? 2 : 1;
  std::vector<double> out(static_cast<size_t>(nacc * C));  // [dw | db]
  detail::sum_rows(rows, C, nacc, 1, out.data(), [&](int64_t r, int64_t c0, int64_t c1, double* acc) {
    const T *xr = x + r * C, *dyr = dy + r * C;  // [C]
    const double m = mu[r], s = rs[r];
    for (int64_t c = c0; c < c1; ++c) acc[c] += double(dyr[c]) * ((double(xr[c]) - m) * s);
    if (nacc == 2)
      for (int64_t c = c0; c < c1; ++c) acc[C + c] += double(dyr[c]);
  });
  for (int64_t c = 0; c < C; ++c) dw[c] = T(out[c]);
  if (db != nullptr)
    for (int64_t c = 0; c < C; ++c) db[c] = T(out[C + c]);
}

template <class T>
void rmsnorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "rmsnorm_backward rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T *xr = x + r * C, *dyr = dy + r * C;  // [C]
    T* dxr = dx + r * C;
    const double rs = rmsnorm_rstd(xr, C, eps);
    // dx = rs · (g - xhat · mean(g · xhat)) = rs · g - x · rs³ · mean(g · x), g = dy · w
    const double sgx = sum_idx(C, [&](int64_t c) { return double(dyr[c]) * double(w[c]) * double(xr[c]); });
    const double k = rs * rs * rs * sgx / double(C);
    for (int64_t c = 0; c < C; ++c) dxr[c] = T(rs * double(dyr[c]) * double(w[c]) - double(xr[c]) * k);
  }
}

template <class T>
void rmsnorm_backward_weight(const T* dy, const T* x, T* dw, int64_t rows, int64_t C, double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "rmsnorm_backward rows ", rows, " C ", C);
  std::vector<double> rs(static_cast<size_t>(rows));  // [rows]
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) rs[r] = rmsnorm_rstd(x + r * C, C, eps);
  std::vector<double> out(static_cast<size_t>(C));  // [C]
  detail::sum_rows(rows, C, 1, 1, out.data(), [&](int64_t r, int64_t c0, int64_t c1, double* acc) {
    const T *xr = x + r * C, *dyr = dy + r * C;  // [C]
    const double s = rs[r];
    for (int64_t c = c0; c < c1; ++c) acc[c] += double(dyr[c]) * (double(xr[c]) * s);
  });
  for (int64_t c = 0; c < C; ++c) dw[c] = T(out[c]);
}

template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t C) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "softmax_backward rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * C, *yr = y + r * C;  // [C]; dx may alias dy
    T* dxr = dx + r * C;
    const double dot = sum_idx(C, [&](int64_t c) { return double(dyr[c]) * double(yr[c]); });
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
template void add_norm_forward<float>(const float*, const float*, const float*, const float*, float*, float*,
                                      int64_t, int64_t, double, bool);
template void add_norm_forward<double>(const double*, const double*, const double*, const double*, double*,
                                       double*, int64_t, int64_t, double, bool);
template void softmax_forward<float>(const float*, float*, int64_t, int64_t);
template void softmax_forward<double>(const double*, double*, int64_t, int64_t);

#define AUTOSP_INSTANTIATE_BACKWARD(T)                                                              \
  template void layernorm_backward_input<T>(const T*, const T*, const T*, T*, int64_t, int64_t, double); \
  template void layernorm_backward_params<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);    \
  template void rmsnorm_backward_input<T>(const T*, const T*, const T*, T*, int64_t, int64_t, double);   \
  template void rmsnorm_backward_weight<T>(const T*, const T*, T*, int64_t, int64_t, double);           \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);
AUTOSP_INSTANTIATE_BACKWARD(float)
AUTOSP_INSTANTIATE_BACKWARD(double)
#undef AUTOSP_INSTANTIATE_BACKWARD

}  // namespace autosp::cpu
