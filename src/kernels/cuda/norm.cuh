// CUDA normalisation launchers over the last dim: layernorm, RMSNorm and softmax, forward and
// backward. The same operations and argument order as kernels/cpu/norm.h, over device pointers,
// enqueued on `stream`. Knows nothing of graphs.
//
// x, y, dy, dx: [rows, C] contiguous; w, b, dw, db: [C]; mean, rstd (optional, may be null): [rows].
// T is float, double or bf16 (all operands the same T); statistics accumulate in acc_t<T>.
// Parameter gradients are deterministic (fixed row chunks, partials added in chunk order).
#pragma once

#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

// y = (x - mean) · rstd · w + b, rstd = 1/sqrt(var + eps) (biased variance). b may be null.
template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows, int64_t C, double eps,
                       cudaStream_t stream);

// y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps).
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t C, double eps, cudaStream_t stream);

// Fused residual add + norm: s = x + r, or with r's bias rb [C] (not null) s = x + (r + rb), the
// bias sum rounded to T first as the unfused add stores it; y = layernorm(s) with w, b (b may be
// null) or, when `rms`, rmsnorm(s) with w; the sum is formed in acc_t<T> and rounded once into s,
// and y is normalised from s as stored (for bf16 the rounded sum, as layernorm_forward /
// rmsnorm_forward on s would: the same bits; decision 270). s must not alias x or r.
template <class T>
void add_norm_forward(const T* x, const T* r, const T* rb, const T* w, const T* b, T* y, T* s, int64_t rows, int64_t C,
                      double eps, bool rms, cudaStream_t stream);

// y = softmax over the last dim. x and y may alias.
template <class T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t C, cudaStream_t stream);

// ---- backward (statistics are recomputed from x) ----

template <class T>
void layernorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps,
                              cudaStream_t stream);
// dw[c] = Σ_r dy · xhat; db[c] = Σ_r dy (db may be null).
template <class T>
void layernorm_backward_params(const T* dy, const T* x, T* dw, T* db, int64_t rows, int64_t C, double eps,
                               cudaStream_t stream);
// Both (the op's launcher): the two kernels above, one after the other.
template <class T>
void layernorm_backward(const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, int64_t rows, int64_t C, double eps,
                        cudaStream_t stream);
template <class T>
void rmsnorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps,
                            cudaStream_t stream);
// dw[c] = Σ_r dy · x · rstd.
template <class T>
void rmsnorm_backward_weight(const T* dy, const T* x, T* dw, int64_t rows, int64_t C, double eps, cudaStream_t stream);
// dx = y · (dy - Σ_c dy · y). dx may alias dy.
template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t C, cudaStream_t stream);

}  // namespace autosp::cuda
