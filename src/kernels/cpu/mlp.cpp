// CPU tiled SwiGLU MLP (kernels/cpu/mlp.h): chunks of rows, each three GEMMs forward (gate, up,
// down) and seven backward (gate and up recomputed, then dWd, dh, dx twice, dWg, dWu), all through
// gemm_batched (our packed sgemm / OpenBLAS); the elementwise steps between them are plain loops
// split across threads. Weight gradients accumulate with beta = 1 from the second chunk on, in
// chunk order, so the sums do not depend on the thread count.
#include "kernels/cpu/mlp.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "tensor/check.h"

namespace autosp::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;  // elements below which the elementwise loops stay serial

template <class T>
T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}

// g, u [r, I] = x_c [r, C] · Wgᵀ, x_c · Wuᵀ
template <class T>
void gate_up(const T* x_c, const T* w_gate, const T* w_up, T* g, T* u, int64_t r, int64_t C, int64_t I) {
  gemm_batched<T>(false, true, 1, r, I, C, T(1), x_c, 0, w_gate, 0, T(0), g, 0);
  gemm_batched<T>(false, true, 1, r, I, C, T(1), x_c, 0, w_up, 0, T(0), u, 0);
}

// h = silu(g) ∘ u, elementwise over n entries (h may alias g or u).
template <class T>
void swiglu(const T* g, const T* u, T* h, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

}  // namespace

template <class T>
void swiglu_mlp_forward(const T* x, const T* w_gate, const T* w_up, const T* w_down, T* y, int64_t rows, int64_t C,
                        int64_t I, int64_t chunk_rows) {
  AUTOSP_ASSERT(chunk_rows > 0 && C > 0 && I > 0, "swiglu_mlp_forward: chunk ", chunk_rows, " C ", C, " I ", I);
  const int64_t r_max = std::min(rows, chunk_rows);
  std::vector<T> g(size_t(r_max * I)), u(size_t(r_max * I));  // [r, I] scratch
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t r = std::min(chunk_rows, rows - r0);
    gate_up(x + r0 * C, w_gate, w_up, g.data(), u.data(), r, C, I);
    swiglu(g.data(), u.data(), g.data(), r * I);
    // y_c [r, C] = h [r, I] · Wdᵀ (Wd [C, I])
    gemm_batched<T>(false, true, 1, r, C, I, T(1), g.data(), 0, w_down, 0, T(0), y + r0 * C, 0);
  }
}

template <class T>
void swiglu_mlp_backward(const T* dy, const T* x, const T* w_gate, const T* w_up, const T* w_down, T* dx, T* dw_gate,
                         T* dw_up, T* dw_down, int64_t rows, int64_t C, int64_t I, int64_t chunk_rows) {
  AUTOSP_ASSERT(chunk_rows > 0 && C > 0 && I > 0, "swiglu_mlp_backward: chunk ", chunk_rows, " C ", C, " I ", I);
  if (rows == 0) {  // no rows: the weight gradients are zero
    std::fill(dw_gate, dw_gate + I * C, T(0));
    std::fill(dw_up, dw_up + I * C, T(0));
    std::fill(dw_down, dw_down + C * I, T(0));
    return;
  }
  const int64_t r_max = std::min(rows, chunk_rows);
  std::vector<T> g(size_t(r_max * I)), u(size_t(r_max * I)), t(size_t(r_max * I));  // [r, I] scratch
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t r = std::min(chunk_rows, rows - r0), n = r * I;
    const T* x_c = x + r0 * C;
    const T* dy_c = dy + r0 * C;
    const T beta = r0 == 0 ? T(0) : T(1);  // the first chunk overwrites the weight gradients
    gate_up(x_c, w_gate, w_up, g.data(), u.data(), r, C, I);
    swiglu(g.data(), u.data(), t.data(), n);
    // dWd [C, I] += dy_cᵀ [C, r] · h [r, I]
    gemm_batched<T>(true, false, 1, C, I, r, T(1), dy_c, 0, t.data(), 0, beta, dw_down, 0);
    // dh [r, I] = dy_c [r, C] · Wd [C, I]
    gemm_batched<T>(false, false, 1, r, I, C, T(1), dy_c, 0, w_down, 0, T(0), t.data(), 0);
    // dg = dh ∘ u ∘ silu'(g) into g, du = dh ∘ silu(g) into u; silu'(g) = s·(1 + g·(1 - s)), s = sigmoid(g)
    T* gp = g.data();
    T* up = u.data();
    const T* dh = t.data();
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t i = 0; i < n; ++i) {
      const T gv = gp[i], s = sigmoid(gv);
      gp[i] = dh[i] * up[i] * (s * (T(1) + gv * (T(1) - s)));
      up[i] = dh[i] * (gv * s);
    }
    // dx_c [r, C] = dg [r, I] · Wg [I, C] + du · Wu
    T* dx_c = dx + r0 * C;
    gemm_batched<T>(false, false, 1, r, C, I, T(1), gp, 0, w_gate, 0, T(0), dx_c, 0);
    gemm_batched<T>(false, false, 1, r, C, I, T(1), up, 0, w_up, 0, T(1), dx_c, 0);
    // dWg, dWu [I, C] += dgᵀ, duᵀ [I, r] · x_c [r, C]
    gemm_batched<T>(true, false, 1, I, C, r, T(1), gp, 0, x_c, 0, beta, dw_gate, 0);
    gemm_batched<T>(true, false, 1, I, C, r, T(1), up, 0, x_c, 0, beta, dw_up, 0);
  }
}

#define AUTOSP_INSTANTIATE_MLP(T)                                                                                  \
  template void swiglu_mlp_forward<T>(const T*, const T*, const T*, const T*, T*, int64_t, int64_t, int64_t,      \
                                      int64_t);                                                                 \
  template void swiglu_mlp_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, int64_t, \
                                       int64_t, int64_t, int64_t);
AUTOSP_INSTANTIATE_MLP(float)
AUTOSP_INSTANTIATE_MLP(double)
#undef AUTOSP_INSTANTIATE_MLP

}  // namespace autosp::cpu
