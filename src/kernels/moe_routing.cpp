// moe_route and moe_probs_grad (kernels/moe_routing.h): host code both kernel backends use.
#include "kernels/moe_routing.h"

#include <algorithm>

#include "tensor/check.h"

namespace autosp::kernels {

int64_t MoeRouting::max_rows() const {
  int64_t m = 0;
  for (int64_t e = 0; e < E; ++e) m = std::max(m, rows_of(e));
  return m;
}

template <class T>
MoeRouting moe_route(const T* probs, int64_t R, int64_t E, int64_t k, bool norm) {
  AUTOSP_ASSERT(k >= 1 && k <= E, "moe_route: top_k ", k, " of ", E, " experts");
  MoeRouting r;
  r.R = R, r.E = E, r.k = k;
  r.expert.resize(size_t(R * k));
  r.weight.resize(size_t(R * k));
  r.sum.resize(size_t(R));
  r.offset.assign(size_t(E + 1), 0);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t row = 0; row < R; ++row) {
    const T* p = probs + row * E;
    for (int64_t e = 0; e < E; ++e) order[e] = int32_t(e);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    T s = T(0);  // in T, in top-k order, as torch sums the k probabilities
    for (int64_t j = 0; j < k; ++j) s += p[order[j]];
    r.sum[row] = double(s);
    for (int64_t j = 0; j < k; ++j) {
      const T w = norm ? T(p[order[j]] / s) : p[order[j]];
      r.expert[row * k + j] = order[j];
      r.weight[row * k + j] = double(w);
      ++r.offset[order[j] + 1];
    }
  }
  for (int64_t e = 0; e < E; ++e) r.offset[e + 1] += r.offset[e];
  r.slot.resize(size_t(R * k));
  std::vector<int64_t> next(r.offset.begin(), r.offset.end() - 1);
  for (int64_t s = 0; s < R * k; ++s) r.slot[next[r.expert[s]]++] = s;
  return r;
}

template <class T>
void moe_probs_grad(const MoeRouting& r, bool norm, const double* g, T* dprobs) {
  std::fill(dprobs, dprobs + r.R * r.E, T(0));
  for (int64_t row = 0; row < r.R; ++row) {
    const int64_t s0 = row * r.k;
    double wg = 0;  // Σ_j w_j g_j
    for (int64_t j = 0; j < r.k; ++j) wg += r.weight[s0 + j] * g[s0 + j];
    for (int64_t j = 0; j < r.k; ++j)
      dprobs[row * r.E + r.expert[s0 + j]] = T(norm ? (g[s0 + j] - wg) / r.sum[row] : g[s0 + j]);
  }
}

template MoeRouting moe_route<float>(const float*, int64_t, int64_t, int64_t, bool);
template MoeRouting moe_route<double>(const double*, int64_t, int64_t, int64_t, bool);
template void moe_probs_grad<float>(const MoeRouting&, bool, const double*, float*);
template void moe_probs_grad<double>(const MoeRouting&, bool, const double*, double*);

}  // namespace autosp::kernels
