// CPU tiled SwiGLU MLP (kernels/cpu/mlp.h): chunks of rows, each three GEMMs forward (gate, up,
// down) and seven backward (gate and up recomputed, then dWd, dh, dx twice, dWg, dWu), all through
// gemm_batched (our packed sgemm / OpenBLAS); the elementwise steps between them are plain loops
// split across threads. Weight gradients accumulate with beta = 1 from the second chunk on, in
// chunk order, so the sums do not depend on the thread count. The bf16 versions run the same
// chunks on the bf16 GEMM (gemm_bf16_batched), f32 between the GEMMs.
#include "kernels/cpu/mlp.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "tensor/check.h"
#include "tensor/convert.h"

namespace autosp::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;  // elements below which the elementwise loops stay serial

template <class T>
T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}

// dg = dh ∘ u ∘ silu'(g), du = dh ∘ silu(g) at one entry; silu'(g) = s·(1 + g·(1 - s)), s = sigmoid(g).
template <class T>
void swiglu_grad(T g, T u, T dh, T& dg, T& du) {
  const T s = sigmoid(g);
  dg = dh * u * (s * (T(1) + g * (T(1) - s)));
  du = dh * (g * s);
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
    // dg into g, du into u
    T* gp = g.data();
    T* up = u.data();
    const T* dh = t.data();
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t i = 0; i < n; ++i) swiglu_grad(gp[i], up[i], dh[i], gp[i], up[i]);
    // dx_c [r, C] = dg [r, I] · Wg [I, C] + du · Wu
    T* dx_c = dx + r0 * C;
    gemm_batched<T>(false, false, 1, r, C, I, T(1), gp, 0, w_gate, 0, T(0), dx_c, 0);
    gemm_batched<T>(false, false, 1, r, C, I, T(1), up, 0, w_up, 0, T(1), dx_c, 0);
    // dWg, dWu [I, C] += dgᵀ, duᵀ [I, r] · x_c [r, C]
    gemm_batched<T>(true, false, 1, I, C, r, T(1), gp, 0, x_c, 0, beta, dw_gate, 0);
    gemm_batched<T>(true, false, 1, I, C, r, T(1), up, 0, x_c, 0, beta, dw_up, 0);
  }
}

// ---- bf16 ----

namespace {

// g, u [r, I] (f32) = x_c · Wgᵀ, x_c · Wuᵀ, and h = silu(g) ∘ u rounded to bf16.
void gate_up_h16(Bf16Gemm path, const uint16_t* x_c, const uint16_t* w_gate, const uint16_t* w_up, float* g, float* u,
                 uint16_t* h, int64_t r, int64_t C, int64_t I) {
  gemm_bf16(path, false, true, r, I, C, x_c, w_gate, 0.0f, g);
  gemm_bf16(path, false, true, r, I, C, x_c, w_up, 0.0f, u);
#pragma omp parallel for schedule(static) if (r * I > kGrain)
  for (int64_t i = 0; i < r * I; ++i) h[i] = f32_to_bf16(g[i] * sigmoid(g[i]) * u[i]);
}

}  // namespace

void swiglu_mlp_forward_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* w_gate, const uint16_t* w_up,
                             const uint16_t* w_down, uint16_t* y, int64_t rows, int64_t C, int64_t I,
                             int64_t chunk_rows) {
  AUTOSP_ASSERT(chunk_rows > 0 && C > 0 && I > 0, "swiglu_mlp_forward_bf16: chunk ", chunk_rows, " C ", C, " I ", I);
  const int64_t r_max = std::min(rows, chunk_rows);
  std::vector<float> g(size_t(r_max * I)), u(g.size()), y_c(size_t(r_max * C));
  std::vector<uint16_t> h(g.size());
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t r = std::min(chunk_rows, rows - r0);
    gate_up_h16(path, x + r0 * C, w_gate, w_up, g.data(), u.data(), h.data(), r, C, I);
    gemm_bf16(path, false, true, r, C, I, h.data(), w_down, 0.0f, y_c.data());  // h · Wdᵀ
    cast<float, uint16_t>(y_c.data(), y + r0 * C, r * C);
  }
}

void swiglu_mlp_backward_bf16(Bf16Gemm path, const uint16_t* dy, const uint16_t* x, const uint16_t* w_gate,
                              const uint16_t* w_up, const uint16_t* w_down, uint16_t* dx, uint16_t* dw_gate,
                              uint16_t* dw_up, uint16_t* dw_down, int64_t rows, int64_t C, int64_t I,
                              int64_t chunk_rows) {
  AUTOSP_ASSERT(chunk_rows > 0 && C > 0 && I > 0, "swiglu_mlp_backward_bf16: chunk ", chunk_rows, " C ", C, " I ", I);
  const int64_t r_max = std::min(rows, chunk_rows);
  std::vector<float> g(size_t(r_max * I)), u(g.size()), dh(g.size()), dx_c(size_t(r_max * C));
  std::vector<float> dwg(size_t(I * C)), dwu(dwg.size()), dwd(dwg.size());  // the sums over the chunks (0: no rows)
  std::vector<uint16_t> h(g.size()), dg(g.size()), du(g.size());
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t r = std::min(chunk_rows, rows - r0), n = r * I;
    const uint16_t* x_c = x + r0 * C;
    const uint16_t* dy_c = dy + r0 * C;
    const float beta = r0 == 0 ? 0.0f : 1.0f;
    gate_up_h16(path, x_c, w_gate, w_up, g.data(), u.data(), h.data(), r, C, I);
    gemm_bf16(path, true, false, C, I, r, dy_c, h.data(), beta, dwd.data());      // dWd += dy_cᵀ · h
    gemm_bf16(path, false, false, r, I, C, dy_c, w_down, 0.0f, dh.data());        // dh = dy_c · Wd
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t i = 0; i < n; ++i) {
      float dgi, dui;
      swiglu_grad(g[i], u[i], dh[i], dgi, dui);
      dg[i] = f32_to_bf16(dgi), du[i] = f32_to_bf16(dui);
    }
    gemm_bf16(path, false, false, r, C, I, dg.data(), w_gate, 0.0f, dx_c.data());  // dx_c = dg · Wg + du · Wu
    gemm_bf16(path, false, false, r, C, I, du.data(), w_up, 1.0f, dx_c.data());
    cast<float, uint16_t>(dx_c.data(), dx + r0 * C, r * C);
    gemm_bf16(path, true, false, I, C, r, dg.data(), x_c, beta, dwg.data());      // dWg, dWu += dgᵀ, duᵀ · x_c
    gemm_bf16(path, true, false, I, C, r, du.data(), x_c, beta, dwu.data());
  }
  cast<float, uint16_t>(dwg.data(), dw_gate, I * C);
  cast<float, uint16_t>(dwu.data(), dw_up, I * C);
  cast<float, uint16_t>(dwd.data(), dw_down, C * I);
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
