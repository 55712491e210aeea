// CUDA tiled SwiGLU MLP (mlp.cuh): the chunk loops of kernels/cpu/mlp.h on cuBLASLt GEMMs
// (matmul.cuh) and the elementwise launchers (elementwise.cuh). No kernels of its own.
#include "kernels/cuda/mlp.cuh"

#include <algorithm>

#include "kernels/cuda/elementwise.cuh"

namespace autosp::cuda {

namespace {

// out = a ∘ b over n contiguous elements (out may alias a or b).
template <class T>
void mul_n(const T* a, const T* b, T* out, int64_t n, cudaStream_t s) {
  const int64_t shape[1] = {n}, unit[1] = {1};
  binary<T>(kernels::Binary::mul, 1, shape, a, unit, b, unit, out, s);
}

// g, u [r, I] = x_c [r, C] · Wgᵀ, x_c · Wuᵀ
template <class T>
void gate_up(const T* x_c, const T* wg, const T* wu, T* g, T* u, int64_t r, int64_t C, int64_t I, cudaStream_t s) {
  gemm_batched<T>(false, true, 1, r, I, C, 1.0, x_c, 0, wg, 0, 0.0, g, 0, s);
  gemm_batched<T>(false, true, 1, r, I, C, 1.0, x_c, 0, wu, 0, 0.0, u, 0, s);
}

}  // namespace

template <class T>
void swiglu_mlp(const T* x, const T* wg, const T* wu, const T* wd, T* y, int64_t R, int64_t C, int64_t I,
                int64_t chunk, T* g, T* u, cudaStream_t s) {
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t r = std::min(chunk, R - r0);
    gate_up(x + r0 * C, wg, wu, g, u, r, C, I, s);
    unary<T>(kernels::Unary::silu, g, g, r * I, 0.0, s);
    mul_n(g, u, g, r * I, s);  // h
    gemm_batched<T>(false, true, 1, r, C, I, 1.0, g, 0, wd, 0, 0.0, y + r0 * C, 0, s);
  }
}

template <class T>
void swiglu_mlp_backward(const T* dy, const T* x, const T* wg, const T* wu, const T* wd, T* dx, T* dwg, T* dwu,
                         T* dwd, int64_t R, int64_t C, int64_t I, int64_t chunk, T* const (&scratch)[4], float* acc,
                         cudaStream_t s) {
  const int64_t n_acc = ChunkedGradient<T>::acc_elems(I, C);
  // The weight gradients summed over the chunks (in f32 for bf16: ChunkedGradient).
  ChunkedGradient<T> gwg{dwg, acc, I, C}, gwu{dwu, acc ? acc + n_acc : nullptr, I, C},
      gwd{dwd, acc ? acc + 2 * n_acc : nullptr, C, I};
  T *g = scratch[0], *u = scratch[1], *t = scratch[2], *v = scratch[3];
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t r = std::min(chunk, R - r0), n = r * I;
    const T* x_c = x + r0 * C;
    const T* dy_c = dy + r0 * C;
    T* dx_c = dx + r0 * C;
    gate_up(x_c, wg, wu, g, u, r, C, I, s);
    unary<T>(kernels::Unary::silu, g, v, n, 0.0, s);  // v = silu(g)
    mul_n(v, u, t, n, s);                              // t = h
    gwd.add(true, false, r, dy_c, t, s);                                             // dWd += dy_cᵀ·h
    gemm_batched<T>(false, false, 1, r, I, C, 1.0, dy_c, 0, wd, 0, 0.0, t, 0, s);    // t = dh
    mul_n(v, t, v, n, s);                                             // v = du = dh ∘ silu(g)
    mul_n(u, t, u, n, s);                                             // u = dh ∘ u
    unary_backward<T>(kernels::UnaryGrad::silu, u, g, u, n, s);       // u = dg = dh ∘ u ∘ silu'(g)
    gemm_batched<T>(false, false, 1, r, C, I, 1.0, u, 0, wg, 0, 0.0, dx_c, 0, s);    // dx_c = dg·Wg
    gemm_batched<T>(false, false, 1, r, C, I, 1.0, v, 0, wu, 0, 1.0, dx_c, 0, s);    //      + du·Wu
    gwg.add(true, false, r, u, x_c, s);                                              // dWg += dgᵀ·x_c
    gwu.add(true, false, r, v, x_c, s);                                              // dWu += duᵀ·x_c
  }
  for (ChunkedGradient<T>* gw : {&gwg, &gwu, &gwd}) gw->finish(s);  // zeros when R = 0
}

#define AUTOSP_INSTANTIATE(T)                                                                                         \
  template void swiglu_mlp<T>(const T*, const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, T*, T*, \
                              cudaStream_t);                                                                          \
  template void swiglu_mlp_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, int64_t,     \
                                       int64_t, int64_t, int64_t, T* const (&)[4], float*, cudaStream_t);
AUTOSP_INSTANTIATE(float)
AUTOSP_INSTANTIATE(double)
AUTOSP_INSTANTIATE(bf16)
#undef AUTOSP_INSTANTIATE

}  // namespace autosp::cuda
