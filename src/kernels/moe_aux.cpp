// moe_router_stats and moe_aux_loss (kernels/moe_aux.h): host code both kernel backends use.
#include "kernels/moe_aux.h"

#include <cstddef>
#include <vector>

#include "kernels/moe_routing.h"

namespace autosp::kernels {

template <class T>
void moe_router_stats(const T* probs, int64_t R, int64_t E, int64_t k, T* stats) {
  const MoeRouting r = moe_route(probs, R, E, k, false);
  std::vector<double> sum(static_cast<size_t>(E), 0.0);
  for (int64_t row = 0; row < R; ++row)
    for (int64_t e = 0; e < E; ++e) sum[e] += static_cast<double>(probs[row * E + e]);
  for (int64_t e = 0; e < E; ++e) {
    stats[e] = static_cast<T>(r.rows_of(e));
    stats[E + e] = static_cast<T>(sum[e]);
  }
}

template <class T>
double moe_aux_loss(const T* stats, int64_t L, int64_t E, int64_t k, double share, T* dstats, double g) {
  std::vector<double> C(static_cast<size_t>(E), 0.0), P(static_cast<size_t>(E), 0.0);
  double total = 0;  // Σ_e C_e = N · k
  for (int64_t l = 0; l < L; ++l)
    for (int64_t e = 0; e < E; ++e) {
      C[e] += static_cast<double>(stats[(l * 2) * E + e]);
      P[e] += static_cast<double>(stats[(l * 2 + 1) * E + e]);
      total += static_cast<double>(stats[(l * 2) * E + e]);
    }
  const double N = total / static_cast<double>(k);
  const double scale = N > 0 ? share * static_cast<double>(E) / (N * N) : 0.0;  // no rows: no loss
  double loss = 0;
  for (int64_t e = 0; e < E; ++e) loss += C[e] * P[e];
  if (dstats)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t e = 0; e < E; ++e) {
        dstats[(l * 2) * E + e] = T(0);
        dstats[(l * 2 + 1) * E + e] = static_cast<T>(g * scale * C[e]);
      }
  return scale * loss;
}

template void moe_router_stats<float>(const float*, int64_t, int64_t, int64_t, float*);
template void moe_router_stats<double>(const double*, int64_t, int64_t, int64_t, double*);
template double moe_aux_loss<float>(const float*, int64_t, int64_t, int64_t, double, float*, double);
template double moe_aux_loss<double>(const double*, int64_t, int64_t, int64_t, double, double*, double);

}  // namespace autosp::kernels
