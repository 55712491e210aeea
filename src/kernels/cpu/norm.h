// CPU normalisation launchers over the last dim. Knows nothing of graphs.
// x, y: [rows, C] contiguous. mean/rstd (optional, may be null): [rows], saved for backward.
#pragma once

#include <cstdint>

namespace autosp::cpu {

// y = (x - mean) · rstd · w + b, rstd = 1/sqrt(var + eps), var is the biased variance. b may be null.
template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows,
                       int64_t C, double eps);

// y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps) (Hugging Face LlamaRMSNorm).
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t C, double eps);

// Fused residual add + norm (one pass over each row): s = x + r (added in T, like the add kernel),
// or with r's bias rb [C] (not null) s = x + (r + rb), each add rounded to T as the two unfused
// adds round; y = layernorm(s) with w, b (b may be null) or, when `rms`, y = rmsnorm(s) with w.
// x, r, y, s: [rows, C]; s may alias x or r.
template <class T>
void add_norm_forward(const T* x, const T* r, const T* rb, const T* w, const T* b, T* y, T* s, int64_t rows,
                      int64_t C, double eps, bool rms);

// Softmax over the last dim: y[r, :] = exp(x[r, :] - max) / sum. x and y may alias.
template <class T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t C);

// ---- backward (statistics are recomputed from x; nothing is saved by the forward) ----

// dx of layernorm: dx = rstd · (g - mean(g) - xhat · mean(g · xhat)), g = dy · w.
template <class T>
void layernorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps);
// dw[c] = Σ_r dy[r, c] · xhat[r, c]; db[c] = Σ_r dy[r, c] (db may be null). Deterministic.
template <class T>
void layernorm_backward_params(const T* dy, const T* x, T* dw, T* db, int64_t rows, int64_t C, double eps);
// Both in one pass of rows (what the layernorm_backward op runs): each row's statistics computed
// once for dx, dw and db; the same values as the two calls.
template <class T>
void layernorm_backward(const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, int64_t rows, int64_t C,
                        double eps);
// dx of rmsnorm: dx = rstd · (g - xhat · mean(g · xhat)), g = dy · w, xhat = x · rstd.
template <class T>
void rmsnorm_backward_input(const T* dy, const T* x, const T* w, T* dx, int64_t rows, int64_t C, double eps);
// dw[c] = Σ_r dy[r, c] · x[r, c] · rstd[r]. Deterministic.
template <class T>
void rmsnorm_backward_weight(const T* dy, const T* x, T* dw, int64_t rows, int64_t C, double eps);
// dx = y · (dy - Σ_c dy · y), y = softmax output.
template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, int64_t rows, int64_t C);

}  // namespace autosp::cpu
