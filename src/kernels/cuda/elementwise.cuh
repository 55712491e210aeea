// CUDA elementwise launchers: unary maps and their activation gradients, broadcasting binary ops,
// strided copies, fill, dtype casts and the deterministic sums sum_to and sum_squares. The same
// operations as kernels/cpu/elementwise.h (the kinds both take: kernels/kinds.h), over device pointers, enqueued
// on `stream` (nothing synchronises). Knows nothing of graphs.
//
// T is float, double or bf16 for the arithmetic launchers (bf16 computes in float and rounds once
// per result). Broadcasting arrives as strides (0 = broadcast), row-major, rank ≤ kMaxRank; shape
// and stride arrays are host memory.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/kinds.h"
#include "tensor/strided.h"  // kMaxRank

namespace autosp::cuda {

using kernels::Binary;
using kernels::Unary;
using kernels::UnaryGrad;

// y[i] = f(x[i]) for i < n; `scalar` is the factor of Unary::scale. x and y may alias.
template <class T>
void unary(Unary op, const T* x, T* y, int64_t n, double scalar, cudaStream_t stream);

// dx[i] = dy[i] · f'(x[i]) for the activation f. dx may alias dy.
template <class T>
void unary_backward(UnaryGrad op, const T* dy, const T* x, T* dx, int64_t n, cudaStream_t stream);

// Fused bias + tanh-GELU over x [rows, C], b [C]: y = gelu_tanh(x + b), the sum in acc_t<T> (for
// bf16 not rounded before the GELU, like the CPU emulation). x and y may alias.
template <class T>
void bias_gelu_tanh(const T* x, const T* b, T* y, int64_t rows, int64_t C, cudaStream_t stream);
// dx = dy · gelu_tanh'(x + b) in one pass. dx may alias dy or x.
template <class T>
void bias_gelu_tanh_backward(const T* dy, const T* x, const T* b, T* dx, int64_t rows, int64_t C, cudaStream_t stream);

// GPT-2's qkv into heads (kernels/cpu/elementwise.h qkv_heads): x [B, S, 3, N, D] + b [3, N, D] →
// q, k, v [B, N, S, D], the sum in acc_t<T>, one rounding; the backward lays dq, dk, dv back as dx
// and sums dx over B and S into db [3, N, D] (sum_to).
template <class T>
void qkv_heads(const T* x, const T* b, T* q, T* k, T* v, int64_t B, int64_t S, int64_t N, int64_t D,
               cudaStream_t stream);
template <class T>
void qkv_heads_backward(const T* dq, const T* dk, const T* dv, T* dx, T* db, int64_t B, int64_t S, int64_t N,
                        int64_t D, cudaStream_t stream);

// h = silu(g) · u and its backward (dg, du) in one pass each, in acc_t<T>, one rounding per output
// (kernels/cpu/elementwise.h swiglu). h may alias g or u; dg may alias dy or g, du may alias u.
template <class T>
void swiglu(const T* g, const T* u, T* h, int64_t n, cudaStream_t stream);
template <class T>
void swiglu_backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n, cudaStream_t stream);

// Inverted dropout, as kernels/cpu/elementwise.h dropout (the same mask: kernels/kinds.h). x and y
// may alias.
template <class T>
void dropout(const T* x, const int64_t* token, T* y, int64_t rows, int64_t C, uint64_t seed, uint64_t threshold,
             double scale, cudaStream_t stream);

// out[idx] = a[idx·a_strides] op b[idx·b_strides] over the row-major index space `out_shape`
// (out is contiguous). max/min propagate NaN like torch.maximum.
template <class T>
void binary(Binary op, int rank, const int64_t* out_shape, const T* a, const int64_t* a_strides, const T* b,
            const int64_t* b_strides, T* out, cudaStream_t stream);

// dst (contiguous over `shape`) = src read with `src_strides` (transpose, permute, slice, concat
// pieces). T: float, double, bf16, int32_t, int64_t, uint16_t.
template <class T>
void copy_strided(int rank, const int64_t* shape, const T* src, const int64_t* src_strides, T* dst,
                  cudaStream_t stream);

// dst[i] = value for i < n. T as for copy_strided.
template <class T>
void fill(T* dst, int64_t n, T value, cudaStream_t stream);

// dst[i] = Dst(src[i]); floats round to nearest even (once: double → bf16 does not go through
// float). Pairs: float↔bf16, float↔f16, float↔double, double↔bf16, int32_t↔int64_t.
template <class Src, class Dst>
void cast(const Src* src, Dst* dst, int64_t n, cudaStream_t stream);

// Sum x (row-major `x_shape`) down to `out_shape` (same rank; each dim equal to x's or 1, which
// is summed). Deterministic: the split into partial sums depends on the shapes only and the
// partials are added in a fixed order (acc_t<T> accumulation).
template <class T>
void sum_to(const T* x, int rank, const int64_t* x_shape, const int64_t* out_shape, T* out, cudaStream_t stream);

// *out (device) = Σ x[i]², accumulated in double, deterministic (for global gradient norms).
template <class T>
void sum_squares(const T* x, int64_t n, double* out, cudaStream_t stream);

}  // namespace autosp::cuda
