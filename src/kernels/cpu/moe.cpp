// CPU grouped expert MLP (kernels/cpu/moe.h): the routing (kernels/moe_routing.h), then per expert
// a gather of its rows, the tiled SwiGLU MLP (kernels/cpu/mlp.h, whose GEMMs run in parallel) and
// a scatter back. An expert's rows are distinct tokens, so its scatter runs in parallel without
// races; the experts follow one another in index order.
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/mlp.h"
#include "kernels/moe_routing.h"

namespace autosp::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;  // elements below which the gather and scatter loops stay serial

// xe [n, C] = the rows of expert e's slots, from src [R, C] (slot / k is the row).
template <class T>
void gather(const kernels::MoeRouting& r, int64_t e, const T* src, T* xe, int64_t C) {
  const int64_t n = r.rows_of(e), s0 = r.offset[e];
#pragma omp parallel for schedule(static) if (n * C > kGrain)
  for (int64_t a = 0; a < n; ++a) std::copy_n(src + (r.slot[s0 + a] / r.k) * C, C, xe + a * C);
}

}  // namespace

template <class T>
void moe_experts_forward(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                         const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  const int64_t n_max = r.max_rows();
  std::vector<T> xe(size_t(n_max * C)), ye(size_t(n_max * C));
  std::fill(y, y + R * C, T(0));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = r.rows_of(e), s0 = r.offset[e];
    if (n == 0) continue;
    gather(r, e, x, xe.data(), C);
    swiglu_mlp_forward<T>(xe.data(), w_gate[e], w_up[e], w_down[e], ye.data(), n, C, I);
    const T* yp = ye.data();
#pragma omp parallel for schedule(static) if (n * C > kGrain)
    for (int64_t a = 0; a < n; ++a) {
      const int64_t s = r.slot[s0 + a];
      const T w = T(r.weight[s]);
      T* yr = y + (s / k) * C;
      for (int64_t c = 0; c < C; ++c) yr[c] += w * yp[a * C + c];
    }
  }
}

template <class T>
void moe_experts_backward(const T* dy, const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                          const T* const* w_down, T* dx, T* dprobs, T* const* dw_gate, T* const* dw_up,
                          T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  const int64_t n_max = r.max_rows();
  std::vector<T> xe(size_t(n_max * C)), ye(size_t(n_max * C)), dye(size_t(n_max * C)), dxe(size_t(n_max * C));
  std::vector<double> g(size_t(R * k));  // the gradient of each slot's weight
  std::fill(dx, dx + R * C, T(0));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = r.rows_of(e), s0 = r.offset[e];
    const T *wg = w_gate[e], *wu = w_up[e], *wd = w_down[e];
    if (n == 0) {  // no tokens: the expert's weight gradients are zero
      for (T* dw : {dw_gate[e], dw_up[e], dw_down[e]}) std::fill(dw, dw + I * C, T(0));
      continue;
    }
    gather(r, e, x, xe.data(), C);
    swiglu_mlp_forward<T>(xe.data(), wg, wu, wd, ye.data(), n, C, I);
    // g[s] = dy[row] · ye[a]; dye[a] = w[s] · dy[row]
    const T* yp = ye.data();
    T* dyp = dye.data();
#pragma omp parallel for schedule(static) if (n * C > kGrain)
    for (int64_t a = 0; a < n; ++a) {
      const int64_t s = r.slot[s0 + a];
      const T* dyr = dy + (s / k) * C;
      const T w = T(r.weight[s]);
      T dot = T(0);
      for (int64_t c = 0; c < C; ++c) {
        dot += dyr[c] * yp[a * C + c];
        dyp[a * C + c] = w * dyr[c];
      }
      g[s] = double(dot);
    }
    swiglu_mlp_backward<T>(dye.data(), xe.data(), wg, wu, wd, dxe.data(), dw_gate[e], dw_up[e], dw_down[e], n, C, I);
    const T* dxp = dxe.data();
#pragma omp parallel for schedule(static) if (n * C > kGrain)
    for (int64_t a = 0; a < n; ++a) {
      T* dxr = dx + (r.slot[s0 + a] / k) * C;
      for (int64_t c = 0; c < C; ++c) dxr[c] += dxp[a * C + c];
    }
  }
  kernels::moe_probs_grad(r, norm, g.data(), dprobs);
}

#define AUTOSP_MOE(T)                                                                                                \
  template void moe_experts_forward<T>(const T*, const T*, const T* const*, const T* const*, const T* const*, T*,    \
                                       int64_t, int64_t, int64_t, int64_t, int64_t, bool);                           \
  template void moe_experts_backward<T>(const T*, const T*, const T*, const T* const*, const T* const*,             \
                                        const T* const*, T*, T*, T* const*, T* const*, T* const*, int64_t, int64_t, \
                                        int64_t, int64_t, int64_t, bool);
AUTOSP_MOE(float)
AUTOSP_MOE(double)
#undef AUTOSP_MOE

}  // namespace autosp::cpu
