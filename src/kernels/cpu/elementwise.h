// CPU elementwise launchers: unary maps, broadcasting binary ops, strided copies and casts.
// Knows nothing of graphs. Broadcasting is expressed by the caller as strides (0 on a broadcast dim).
//
// All shapes are row-major; `rank` ≤ kMaxRank; strides are in elements.
#pragma once

#include <cstdint>

namespace autosp::cpu {

inline constexpr int kMaxRank = 8;

enum class Unary { neg, exp, log, tanh, sqrt, rsqrt, square, gelu_tanh, silu, scale, relu };
enum class Binary { add, sub, mul, div, max, min };

// y[i] = f(x[i]) for i < n. `scalar` is the factor for Unary::scale (ignored otherwise).
// gelu_tanh: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))); silu: x·sigmoid(x). x and y may alias.
template <class T>
void unary(Unary op, const T* x, T* y, int64_t n, double scalar);

// out[idx] = a[idx·a_strides] op b[idx·b_strides] over the row-major index space `out_shape`
// (out is contiguous). Fast paths: both contiguous; b broadcast along leading dims (bias).
template <class T>
void binary(Binary op, int rank, const int64_t* out_shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out);

// dst (contiguous, row-major over `shape`) = src read with `src_strides`. Used for transpose,
// permute, slice and concat. T is any trivially copyable element (instantiated for float,
// double, int32_t, int64_t, uint16_t).
template <class T>
void copy_strided(int rank, const int64_t* shape, const T* src, const int64_t* src_strides, T* dst);

// dst[i] = value for i < n.
template <class T>
void fill(T* dst, int64_t n, T value);

// Element conversions between the storage dtypes (bf16 / f16 are raw uint16_t bit patterns;
// float→bf16 and float→f16 round to nearest even).
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// double → bf16 rounded once, to nearest even (not through f32, which would round twice).
uint16_t f64_to_bf16(double d);

// y[i] = x[i] converted, for From, To in {float, double, uint16_t = bf16 bits}: to bf16 rounds to
// nearest even (NaN stays NaN, past the range → ±inf); bf16 → f32/f64 and f32 → f64 are exact.
template <class From, class To>
void cast(const From* x, To* y, int64_t n);

// ---- backward and reductions ----

enum class UnaryGrad { gelu_tanh, silu };
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

// Sum x (row-major `x_shape`, rank ≤ kMaxRank) down to `out_shape` (same rank; each dim either
// equal to x's or 1, which is summed over). Deterministic; float sums accumulate in double.
// This is the one place gradients are summed over broadcast dims.
template <class T>
void sum_to(const T* x, int rank, const int64_t* x_shape, const int64_t* out_shape, T* out);

// Σ x[i]² accumulated in double (for global gradient norms).
template <class T>
double sum_squares(const T* x, int64_t n);

}  // namespace autosp::cpu
