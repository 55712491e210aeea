// CPU elementwise launchers: unary maps, broadcasting binary ops, fill, sums. Knows nothing of
// graphs. Broadcasting is expressed by the caller as strides (0 on a broadcast dim).
// The strided copy (copy_strided, kMaxRank) and the dtype conversions (bf16/f16 roundings, cast)
// are the tensor library's host loops, re-exported here by the includes: tensor/strided.h,
// tensor/convert.h (one copy each, shared with Tensor::contiguous() and Tensor::to()).
//
// All shapes are row-major; `rank` ≤ kMaxRank; strides are in elements.
#pragma once

#include <cstdint>

#include "kernels/kinds.h"  // Unary, Binary, UnaryGrad
#include "tensor/convert.h"
#include "tensor/strided.h"

namespace autosp::cpu {

using kernels::Binary;
using kernels::Unary;
using kernels::UnaryGrad;

// y[i] = f(x[i]) for i < n. `scalar` is the factor for Unary::scale (ignored otherwise).
// gelu_tanh: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))); silu: x·sigmoid(x). x and y may alias.
template <class T>
void unary(Unary op, const T* x, T* y, int64_t n, double scalar);

// out[idx] = a[idx·a_strides] op b[idx·b_strides] over the row-major index space `out_shape`
// (out is contiguous). Fast paths: both contiguous; b broadcast along leading dims (bias).
template <class T>
void binary(Binary op, int rank, const int64_t* out_shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out);

// Inverted dropout (kernels/kinds.h): y[r, c] = x[r, c] / (1 − p) where dropout_keep(dropout_row(seed,
// token[r]), c, threshold), else 0, over x, y [rows, C] and token [rows]; `scale` = 1 / (1 − p).
// x and y may alias.
template <class T>
void dropout(const T* x, const int64_t* token, T* y, int64_t rows, int64_t C, uint64_t seed, uint64_t threshold,
             double scale);

// dst[i] = value for i < n.
template <class T>
void fill(T* dst, int64_t n, T value);

// ---- backward and reductions ----

// dx[i] = dy[i] · f'(x[i]) for the activation f.
template <class T>
void unary_backward(UnaryGrad op, const T* dy, const T* x, T* dx, int64_t n);

// Fused bias + tanh-GELU over x [rows, C], b [C]: y = gelu_tanh(x + b), the sum rounded to T first
// (exactly add then gelu_tanh). x and y may alias.
template <class T>
void bias_gelu_tanh(const T* x, const T* b, T* y, int64_t rows, int64_t C);
// Its backward in one pass: dx = dy · gelu_tanh'(x + b). dx may alias dy or x.
template <class T>
void bias_gelu_tanh_backward(const T* dy, const T* x, const T* b, T* dx, int64_t rows, int64_t C);

// Llama's SwiGLU activation in one pass (passes/fuse_elementwise: silu(gate) · up): h = silu(g) · u
// over n entries, silu(g) = g · sigmoid(g). h may alias g or u.
template <class T>
void swiglu(const T* g, const T* u, T* h, int64_t n);
// Its backward in one pass, with s = sigmoid(g): dg = dy · u · s · (1 + g · (1 - s)), du = dy · g · s.
// dg may alias dy or g, du may alias u.
template <class T>
void swiglu_backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n);

// GPT-2's qkv into attention heads in one pass (passes/fuse_elementwise): x [B, S, 3, N, D] + b
// [3, N, D] → q, k, v [B, N, S, D] (part 0, 1, 2), each element the one rounded sum x + b. Its
// backward lays dq, dk, dv back as dx [B, S, 3, N, D] (a copy) and sums dx over B and S into the
// bias gradient db [3, N, D] as sum_to does (the same chunks: the same bits, any thread count).
template <class T>
void qkv_heads(const T* x, const T* b, T* q, T* k, T* v, int64_t B, int64_t S, int64_t N, int64_t D);
template <class T>
void qkv_heads_backward(const T* dq, const T* dk, const T* dv, T* dx, T* db, int64_t B, int64_t S, int64_t N,
                        int64_t D);

// Sum x (row-major `x_shape`, rank ≤ kMaxRank) down to `out_shape` (same rank; each dim either
// equal to x's or 1, which is summed over). Deterministic; float sums accumulate in double.
// This is the one place gradients are summed over broadcast dims. T is float, double or uint16_t
// (bf16 bits: read exactly, the double sum rounded to f32 and then to bf16, the bits of the f32
// kernel on x widened, without the widened copy).
template <class T>
void sum_to(const T* x, int rank, const int64_t* x_shape, const int64_t* out_shape, T* out);

// Σ x[i]² accumulated in double (for global gradient norms).
template <class T>
double sum_squares(const T* x, int64_t n);

}  // namespace autosp::cpu
