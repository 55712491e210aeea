// CPU grouped expert MLP (kernels/cpu/moe.h): the routing (kernels/moe_routing.h), then per expert
// and per chunk of its rows a gather, the SwiGLU MLP's GEMMs (gemm_batched: the packed sgemm,
// threaded inside each call) with the activation fused into one pass over the [rows, I] block, and
// a scatter back. An expert's rows are distinct tokens, so its scatter runs in parallel without
// races; the experts follow one another in index order, and the weight gradients sum over the
// chunks in chunk order, so results do not depend on the thread count.
//
// The backward computes each slot's weight gradient g = dy·ye = (dy·Wd)·h from the same block as
// the MLP's backward (d = dy·Wd unweighted, then dh = w·d), so an expert costs seven GEMMs: gate
// and up recomputed, d, dWd, dx twice, dWg and dWu; the expert's output ye is never rebuilt.
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec16.h"
#include "kernels/kinds.h"  // kMlpChunkRows
#include "kernels/moe_routing.h"

namespace autosp::cpu {
namespace {

using vec16::exp16;
using vec16::f32x16;
using vec16::load;
using vec16::load_part;
using vec16::splat;
using vec16::store;
using vec16::store_part;

constexpr int64_t kGrain = 1 << 14;  // elements below which the row loops stay serial

// ---- the activation, one row of I entries at a time (f32: 16 lanes; f64: scalar) ----

[[gnu::always_inline]] inline f32x16 sigmoid(f32x16 v) { return 1.0f / (1.0f + exp16(-v)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// h = silu(g) ∘ u over one row (h may alias g).
AUTOSP_VEC16_CLONES void swiglu_row(const float* g, const float* u, float* h, int64_t I) {
  int64_t i = 0;
  for (; i + 16 <= I; i += 16) {
    const f32x16 gv = load(g + i);
    store(h + i, gv * sigmoid(gv) * load(u + i));
  }
  if (i < I) {
    const f32x16 gv = load_part(g + i, I - i, 0.0f);
    store_part(h + i, gv * sigmoid(gv) * load_part(u + i, I - i, 0.0f), I - i);
  }
}
void swiglu_row(const double* g, const double* u, double* h, int64_t I) {
  for (int64_t i = 0; i < I; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

// The backward's pass over one row of weight w, from g, u (the gate and up projections) and
// d = dy·Wd (unweighted): s = σ(g), h = g·s·u; returns Σ_i d_i·h_i (the gradient of the slot's
// weight) and writes h ← w·h (what dWd reads), g ← dg = w·d·u·s·(1 + g·(1 − s)), u ← du = w·d·g·s.
template <class V>
[[gnu::always_inline]] inline V swiglu_grad(V& g, V& u, V d, V& h, V w) {
  const V s = sigmoid(g), gs = g * s, dh = w * d;
  const V hv = gs * u, dot = d * hv;
  h = w * hv;
  const V dg = dh * u * (s * (1 + g * (1 - s)));
  u = dh * gs;
  g = dg;
  return dot;
}
AUTOSP_VEC16_CLONES double swiglu_grad_row(float* g, float* u, const float* d, float* h, float w, int64_t I) {
  f32x16 dot = splat(0.0f);
  int64_t i = 0;
  for (; i + 16 <= I; i += 16) {
    f32x16 gv = load(g + i), uv = load(u + i), hv;
    dot += swiglu_grad(gv, uv, load(d + i), hv, splat(w));
    store(g + i, gv), store(u + i, uv), store(h + i, hv);
  }
  if (i < I) {  // the padding lanes are 0: they add 0 to the dot
    const int64_t n = I - i;
    f32x16 gv = load_part(g + i, n, 0.0f), uv = load_part(u + i, n, 0.0f), hv;
    dot += swiglu_grad(gv, uv, load_part(d + i, n, 0.0f), hv, splat(w));
    store_part(g + i, gv, n), store_part(u + i, uv, n), store_part(h + i, hv, n);
  }
  float sum = 0.0f;
  for (int l = 0; l < 16; ++l) sum += dot[l];
  return double(sum);
}
double swiglu_grad_row(double* g, double* u, const double* d, double* h, double w, int64_t I) {
  double dot = 0;
  for (int64_t i = 0; i < I; ++i) dot += swiglu_grad(g[i], u[i], d[i], h[i], w);
  return dot;
}

// ---- one expert ----

// One expert's share of the routing: its slots slot[0, n) (row = slot / k) and their weights.
struct Rows {
  const int64_t* slot;
  int64_t n, k;
  const double* weight;  // indexed by slot
  int64_t row(int64_t a) const { return slot[a] / k; }
};

// dst [n, C] = the rows of src [R, C] that rows.slot[0, n) name.
template <class T>
void gather(const Rows& rows, const T* src, T* dst, int64_t C) {
#pragma omp parallel for schedule(static) if (rows.n * C > kGrain)
  for (int64_t a = 0; a < rows.n; ++a) std::copy_n(src + rows.row(a) * C, C, dst + a * C);
}

// out[row(a)] += (weighted ? w_a : 1) · src[a] for a < n (distinct rows: no races).
template <class T>
void scatter_add(const Rows& rows, const T* src, T* out, int64_t C, bool weighted) {
#pragma omp parallel for schedule(static) if (rows.n * C > kGrain)
  for (int64_t a = 0; a < rows.n; ++a) {
    const T w = weighted ? T(rows.weight[rows.slot[a]]) : T(1);
    T* o = out + rows.row(a) * C;
    const T* s = src + a * C;
    for (int64_t c = 0; c < C; ++c) o[c] += w * s[c];
  }
}

// C [M, N] = op(A) · op(B) + beta · C, one GEMM.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* a, const T* b, T beta, T* c) {
  gemm_batched<T>(ta, tb, 1, M, N, K, T(1), a, 0, b, 0, beta, c, 0);
}

// The scratch of one chunk of up to `rows` rows: g, u, d, h [rows, I]; xe, ye [rows, C].
template <class T>
struct Scratch {
  std::vector<T> g, u, d, h, xe, ye;
  Scratch(int64_t rows, int64_t C, int64_t I, bool backward)
      : g(size_t(rows * I)), u(g.size()), d(backward ? g.size() : 0), h(backward ? g.size() : 0),
        xe(size_t(rows * C)), ye(xe.size()) {}
};

// y[row] += w · swiglu_e(x[row]) for the expert's rows, a chunk at a time.
template <class T>
void expert_forward(const Rows& all, const T* x, const T* wg, const T* wu, const T* wd, T* y, Scratch<T>& s,
                    int64_t C, int64_t I) {
  for (int64_t r0 = 0; r0 < all.n; r0 += kernels::kMlpChunkRows) {
    const Rows rows{all.slot + r0, std::min(kernels::kMlpChunkRows, all.n - r0), all.k, all.weight};
    const int64_t r = rows.n;
    gather(rows, x, s.xe.data(), C);
    gemm<T>(false, true, r, I, C, s.xe.data(), wg, T(0), s.g.data());  // g = xe · Wgᵀ
    gemm<T>(false, true, r, I, C, s.xe.data(), wu, T(0), s.u.data());  // u = xe · Wuᵀ
    T *g = s.g.data(), *u = s.u.data();
#pragma omp parallel for schedule(static) if (r * I > kGrain)
    for (int64_t a = 0; a < r; ++a) swiglu_row(g + a * I, u + a * I, g + a * I, I);
    gemm<T>(false, true, r, C, I, g, wd, T(0), s.ye.data());  // ye = h · Wdᵀ
    scatter_add(rows, s.ye.data(), y, C, true);
  }
}

// The expert's part of the backward: dx[row] += its dx rows, grad[slot] = dy[row] · ye[slot], and
// its weight gradients (overwritten; zero without rows), a chunk at a time.
template <class T>
void expert_backward(const Rows& all, const T* dy, const T* x, const T* wg, const T* wu, const T* wd, T* dx,
                     double* grad, T* dwg, T* dwu, T* dwd, Scratch<T>& s, int64_t C, int64_t I) {
  if (all.n == 0) {
    for (T* dw : {dwg, dwu, dwd}) std::fill(dw, dw + I * C, T(0));
    return;
  }
  for (int64_t r0 = 0; r0 < all.n; r0 += kernels::kMlpChunkRows) {
    const Rows rows{all.slot + r0, std::min(kernels::kMlpChunkRows, all.n - r0), all.k, all.weight};
    const int64_t r = rows.n;
    const T beta = r0 == 0 ? T(0) : T(1);  // the first chunk overwrites the weight gradients
    T *g = s.g.data(), *u = s.u.data(), *d = s.d.data(), *h = s.h.data(), *xe = s.xe.data(), *de = s.ye.data();
    gather(rows, x, xe, C);
    gather(rows, dy, de, C);
    gemm<T>(false, true, r, I, C, xe, wg, T(0), g);   // g = xe · Wgᵀ
    gemm<T>(false, true, r, I, C, xe, wu, T(0), u);   // u = xe · Wuᵀ
    gemm<T>(false, false, r, I, C, de, wd, T(0), d);  // d = dy_e · Wd
#pragma omp parallel for schedule(static) if (r * I > kGrain)
    for (int64_t a = 0; a < r; ++a) {
      const int64_t slot = rows.slot[a];
      grad[slot] = swiglu_grad_row(g + a * I, u + a * I, d + a * I, h + a * I, T(rows.weight[slot]), I);
    }
    gemm<T>(true, false, C, I, r, de, h, beta, dwd);  // dWd += dy_eᵀ · (w ∘ h)
    gemm<T>(false, false, r, C, I, g, wg, T(0), de);  // dx_e = dg · Wg + du · Wu (into dy_e's buffer)
    gemm<T>(false, false, r, C, I, u, wu, T(1), de);
    gemm<T>(true, false, I, C, r, g, xe, beta, dwg);  // dWg += dgᵀ · xe
    gemm<T>(true, false, I, C, r, u, xe, beta, dwu);  // dWu += duᵀ · xe
    scatter_add(rows, de, dx, C, false);
  }
}

Rows rows_of(const kernels::MoeRouting& r, int64_t e) {
  return Rows{r.slot.data() + r.offset[e], r.rows_of(e), r.k, r.weight.data()};
}

int64_t chunk_rows(const kernels::MoeRouting& r) { return std::min(r.max_rows(), kernels::kMlpChunkRows); }

}  // namespace

template <class T>
void moe_experts_forward(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                         const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  Scratch<T> s(chunk_rows(r), C, I, false);
  std::fill(y, y + R * C, T(0));
  for (int64_t e = 0; e < E; ++e) expert_forward(rows_of(r, e), x, w_gate[e], w_up[e], w_down[e], y, s, C, I);
}

template <class T>
void moe_experts_backward(const T* dy, const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                          const T* const* w_down, T* dx, T* dprobs, T* const* dw_gate, T* const* dw_up,
                          T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  Scratch<T> s(chunk_rows(r), C, I, true);
  std::vector<double> g(size_t(R * k));  // the gradient of each slot's weight
  std::fill(dx, dx + R * C, T(0));
  for (int64_t e = 0; e < E; ++e)
    expert_backward(rows_of(r, e), dy, x, w_gate[e], w_up[e], w_down[e], dx, g.data(), dw_gate[e], dw_up[e],
                    dw_down[e], s, C, I);
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
