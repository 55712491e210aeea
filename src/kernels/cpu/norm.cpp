// CPU normalisation kernels over the last dim: layernorm, RMSNorm (Hugging Face LlamaRMSNorm) and
// softmax. Knows nothing of graphs.
//
// Rows are independent and split over OpenMP threads. Row statistics (mean, variance, mean square,
// softmax sum) are accumulated in double for every T, with a two-pass variance, so float results
// match a float64 reference to rounding; the per-element maps are plain loops that vectorise.
#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>

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

}  // namespace

template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows,
                       int64_t C, double eps) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "layernorm rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;  // [C]
    T* yr = y + r * C;
    const double mu = sum_of(xr, C, [](double v) { return v; }) / double(C);
    const double sq = sum_of(xr, C, [mu](double v) { return (v - mu) * (v - mu); });
    const double rs = 1.0 / std::sqrt(sq / double(C) + eps);
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
    const double sq = sum_of(xr, C, [](double v) { return v * v; });
    const double rs = 1.0 / std::sqrt(sq / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) yr[c] = T(double(xr[c]) * rs * double(w[c]));
    if (rstd != nullptr) rstd[r] = T(rs);
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

template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*,
                                       float*, int64_t, int64_t, double);
template void layernorm_forward<double>(const double*, const double*, const double*, double*,
                                        double*, double*, int64_t, int64_t, double);
template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t,
                                     double);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, int64_t,
                                      int64_t, double);
template void softmax_forward<float>(const float*, float*, int64_t, int64_t);
template void softmax_forward<double>(const double*, double*, int64_t, int64_t);

}  // namespace autosp::cpu
