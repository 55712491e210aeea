// CPU cross-entropy: Σ over labelled rows of logsumexp(logits[r]) - logits[r, label[r]], and the
// count of labelled rows. Knows nothing of graphs.
//
// Labels are validated up front (a bad label is the user's data: UsageError naming the label and
// the row); rows are then split over OpenMP threads. Each row uses a stable logsumexp (max first);
// exp runs in T, the row sum and the total are accumulated in double.
//
// Backward: rows split over threads; each row's softmax is recomputed with the same stable
// max-shifted exp, then scaled by grad / sum in double; ignored rows are zero-filled.
#include "kernels/cpu/loss.h"

#include <algorithm>
#include <cmath>

#include "tensor/check.h"

namespace autosp::cpu {

template <class T>
double cross_entropy_sum(const T* logits, const int64_t* labels, int64_t rows, int64_t V,
                         int64_t ignore_index) {
  AUTOSP_ASSERT(rows >= 0 && V > 0, "cross_entropy rows ", rows, " V ", V);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t y = labels[r];
    if (y != ignore_index && (y < 0 || y >= V))
      throw UsageError(str("[cross_entropy] label ", y, " at row ", r, " is outside [0, ", V,
                           ") and is not ignore_index ", ignore_index));
  }
  double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (rows * V > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    if (labels[r] == ignore_index) continue;
    const T* xr = logits + r * V;  // [V]
    T m = xr[0];
    for (int64_t j = 1; j < V; ++j) m = std::max(m, xr[j]);
    double s[4] = {0, 0, 0, 0};  // partial sums of exp(x - max)
    int64_t j = 0;
    for (; j + 4 <= V; j += 4)
      for (int k = 0; k < 4; ++k) s[k] += double(std::exp(xr[j + k] - m));
    for (; j < V; ++j) s[0] += double(std::exp(xr[j] - m));
    const double lse = double(m) + std::log((s[0] + s[1]) + (s[2] + s[3]));
    total += lse - double(xr[labels[r]]);
  }
  return total;
}

template <class T>
void cross_entropy_backward(const T* logits, const int64_t* labels, T* dlogits, int64_t rows, int64_t V, double grad,
                            int64_t ignore_index) {
  AUTOSP_ASSERT(rows >= 0 && V > 0, "cross_entropy_backward rows ", rows, " V ", V);
  for (int64_t r = 0; r < rows; ++r)
    AUTOSP_ASSERT(labels[r] == ignore_index || (labels[r] >= 0 && labels[r] < V), "cross_entropy_backward label ",
                  labels[r], " at row ", r);
#pragma omp parallel for schedule(static) if (rows * V > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = logits + r * V;  // [V]
    T* dr = dlogits + r * V;       // [V]; may alias logits
    if (labels[r] == ignore_index) {
      std::fill(dr, dr + V, T(0));
      continue;
    }
    T m = xr[0];
    for (int64_t j = 1; j < V; ++j) m = std::max(m, xr[j]);
    for (int64_t j = 0; j < V; ++j) dr[j] = std::exp(xr[j] - m);
    double s[4] = {0, 0, 0, 0};  // partial sums of exp(x - max)
    int64_t j = 0;
    for (; j + 4 <= V; j += 4)
      for (int k = 0; k < 4; ++k) s[k] += double(dr[j + k]);
    for (; j < V; ++j) s[0] += double(dr[j]);
    const double g = grad / ((s[0] + s[1]) + (s[2] + s[3]));
    const int64_t y = labels[r];
    const double p_label = double(dr[y]) * g;  // grad · softmax at the label, before the onehot
    for (j = 0; j < V; ++j) dr[j] = T(double(dr[j]) * g);
    dr[y] = T(p_label - grad);
  }
}

int64_t count_valid(const int64_t* labels, int64_t n, int64_t ignore_index) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += labels[i] != ignore_index;
  return count;
}

template double cross_entropy_sum<float>(const float*, const int64_t*, int64_t, int64_t, int64_t);
template double cross_entropy_sum<double>(const double*, const int64_t*, int64_t, int64_t, int64_t);
template void cross_entropy_backward<float>(const float*, const int64_t*, float*, int64_t, int64_t, double,
                                            int64_t);
template void cross_entropy_backward<double>(const double*, const int64_t*, double*, int64_t, int64_t, double,
                                             int64_t);

}  // namespace autosp::cpu
