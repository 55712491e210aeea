// CPU grouped expert MLP (kernels/cpu/moe.h): the routing (kernels/moe_routing.h), then per expert
// and per chunk of its rows a gather, the SwiGLU MLP's GEMMs (gemm_batched: the packed sgemm,
// threaded inside each call) with the activation fused into one pass over the [rows, I] block, and
// a scatter back. An expert's rows are distinct tokens, so its scatter runs in parallel without
// races; the experts follow one another in index order, and the weight gradients sum over the
// chunks in chunk order, so results do not depend on the thread count. Where every thread gets
// two experts with rows, the experts run side by side instead, one thread each, into a buffer
// that a last pass sums per token in expert order: the same bits (see "the experts side by side").
//
// The backward computes each slot's weight gradient g = dy·ye = (dy·Wd)·h from the same block as
// the MLP's backward (d = dy·Wd unweighted, then dh = w·d), so an expert costs seven GEMMs: gate
// and up recomputed, d, dWd, dx twice, dWg and dWu; the expert's output ye is never rebuilt. Where
// the caller keeps the forward's gate and up projections (moe.h's `kept`), the forward's GEMMs
// write them there and the backward starts from them: five GEMMs.
// gpt-oss's options (kinds.h MoeOptions) add the biases in passes over the GEMMs' outputs and
// pick the clamped activation; Mixtral's experts run exactly the code they ran before.
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <omp.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec16.h"
#include "kernels/kinds.h"  // kMlpChunkRows
#include "kernels/moe_routing.h"
#include "tensor/check.h"

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

// gpt-oss's clamped SwiGLU (kernels/kinds.h MoeOptions), lane by lane as above, with the alpha and
// limit as vectors A and L: gc = min(g, L), uc = clamp(u, −L, L), h = (uc + 1)·gc·σ(A·gc).
template <class V>
[[gnu::always_inline]] inline V clamped_glu(V g, V u, V A, V L) {
  const V gc = g > L ? L : g, uc = u > L ? L : (u < -L ? -L : u);
  return (uc + 1) * gc * sigmoid(A * gc);
}
// Its backward pass, as swiglu_grad: dgc = dh·(uc + 1)·s·(1 + A·gc·(1 − s)) with s = σ(A·gc),
// duc = dh·gc·s, each 0 where its clamp cut (g > L; u outside [−L, L]: torch.clamp's gradient).
template <class V>
[[gnu::always_inline]] inline V clamped_glu_grad(V& g, V& u, V d, V& h, V w, V A, V L) {
  const V gc = g > L ? L : g, uc = u > L ? L : (u < -L ? -L : u);
  const V s = sigmoid(A * gc), glu = gc * s, dh = w * d;
  const V hv = (uc + 1) * glu, dot = d * hv;
  h = w * hv;
  const V dg = dh * (uc + 1) * (s * (1 + A * gc * (1 - s)));
  const V du = dh * glu;
  const V zero{};
  g = g <= L ? dg : zero;
  u = (u >= -L) & (u <= L) ? du : zero;
  return dot;
}
AUTOSP_VEC16_CLONES void clamped_row(const float* g, const float* u, float* h, int64_t I, float alpha, float limit) {
  const f32x16 A = splat(alpha), L = splat(limit);
  int64_t i = 0;
  for (; i + 16 <= I; i += 16) store(h + i, clamped_glu(load(g + i), load(u + i), A, L));
  if (i < I) store_part(h + i, clamped_glu(load_part(g + i, I - i, 0.0f), load_part(u + i, I - i, 0.0f), A, L), I - i);
}
void clamped_row(const double* g, const double* u, double* h, int64_t I, double alpha, double limit) {
  for (int64_t i = 0; i < I; ++i) h[i] = clamped_glu(g[i], u[i], alpha, limit);
}
AUTOSP_VEC16_CLONES double clamped_grad_row(float* g, float* u, const float* d, float* h, float w, int64_t I,
                                            float alpha, float limit) {
  const f32x16 A = splat(alpha), L = splat(limit);
  f32x16 dot = splat(0.0f);
  int64_t i = 0;
  for (; i + 16 <= I; i += 16) {
    f32x16 gv = load(g + i), uv = load(u + i), hv;
    dot += clamped_glu_grad(gv, uv, load(d + i), hv, splat(w), A, L);
    store(g + i, gv), store(u + i, uv), store(h + i, hv);
  }
  if (i < I) {  // the padding lanes are 0: they add 0 to the dot
    const int64_t n = I - i;
    f32x16 gv = load_part(g + i, n, 0.0f), uv = load_part(u + i, n, 0.0f), hv;
    dot += clamped_glu_grad(gv, uv, load_part(d + i, n, 0.0f), hv, splat(w), A, L);
    store_part(g + i, gv, n), store_part(u + i, uv, n), store_part(h + i, hv, n);
  }
  float sum = 0.0f;
  for (int l = 0; l < 16; ++l) sum += dot[l];
  return double(sum);
}
double clamped_grad_row(double* g, double* u, const double* d, double* h, double w, int64_t I, double alpha,
                        double limit) {
  double dot = 0;
  for (int64_t i = 0; i < I; ++i) dot += clamped_glu_grad(g[i], u[i], d[i], h[i], w, alpha, limit);
  return dot;
}

// The expert's activation over row a of the [r, I] blocks: h = act(g, u) (h may alias g) ...
template <class T>
void activate_row(const Expert<T>& ex, const T* g, const T* u, T* h, int64_t I) {
  if (ex.clamped)
    clamped_row(g, u, h, I, T(ex.alpha), T(ex.limit));
  else
    swiglu_row(g, u, h, I);
}
// ... and its backward (g ← dg, u ← du, h ← w·h; returns d·h).
template <class T>
double activate_grad_row(const Expert<T>& ex, T* g, T* u, const T* d, T* h, T w, int64_t I) {
  return ex.clamped ? clamped_grad_row(g, u, d, h, w, I, T(ex.alpha), T(ex.limit)) : swiglu_grad_row(g, u, d, h, w, I);
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

// dst [r, n] = src [r, n], the rows split over the threads as gather's.
template <class T>
void copy_rows(const T* src, T* dst, int64_t r, int64_t n) {
#pragma omp parallel for schedule(static) if (r * n > kGrain)
  for (int64_t a = 0; a < r; ++a) std::copy_n(src + a * n, n, dst + a * n);
}

// m [r, n] += the bias b [n] on every row (b null: nothing).
template <class T>
void add_bias(T* m, const T* b, int64_t r, int64_t n) {
  if (!b) return;
#pragma omp parallel for schedule(static) if (r * n > kGrain)
  for (int64_t a = 0; a < r; ++a)
    for (int64_t i = 0; i < n; ++i) m[a * n + i] += b[i];
}

// acc [n] += Σ_a scale(a) · m[a, :] over the rows of m [r, n] (a bias's gradient), each column
// summed in row order by one thread, so the sums do not depend on the thread count.
template <class T, class Scale>
void sum_rows(const T* m, int64_t r, int64_t n, const Scale& scale, double* acc) {
  constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (r * n > kGrain)
  for (int64_t i0 = 0; i0 < n; i0 += kCols)
    for (int64_t a = 0; a < r; ++a) {
      const double sa = scale(a);
      for (int64_t i = i0; i < std::min(n, i0 + kCols); ++i) acc[i] += sa * double(m[a * n + i]);
    }
}

// C [M, N] = op(A) · op(B) + beta · C, one GEMM.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* a, const T* b, T beta, T* c) {
  gemm_batched<T>(ta, tb, 1, M, N, K, T(1), a, 0, b, 0, beta, c, 0);
}

// n values, uninitialised (every use below writes them before it reads them). Where n values fit
// in kHeldBytes they are the calling thread's held block for `role`, kept from call to call as the
// packed sgemm keeps its panels: the experts' scratch is the same size step after step, so its
// pages are faulted in once, not at every call; larger ones are allocated per call.
constexpr int64_t kHeldBytes = int64_t(8) << 20;
enum class Role { chunk, rows };  // the chunk's scratch; the side-by-side buffer of R·k rows

template <class T>
class Storage {
 public:
  Storage(int64_t n, Role role) {
    static thread_local std::vector<T> held[2];
    static thread_local bool busy[2];
    const int i = int(role);
    if (n * int64_t(sizeof(T)) <= kHeldBytes && !busy[i]) {
      if (held[i].size() < size_t(n)) held[i].resize(size_t(n));
      p_ = held[i].data(), busy_ = &busy[i], *busy_ = true;
    } else if (n > 0) {
      own_ = std::make_unique_for_overwrite<T[]>(size_t(n)), p_ = own_.get();
    }
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (busy_) *busy_ = false;
  }
  T* data() const { return p_; }

 private:
  std::unique_ptr<T[]> own_;
  T* p_ = nullptr;
  bool* busy_ = nullptr;
};

// The scratch of one chunk of up to `rows` rows: g, u, d, h [rows, I]; xe, ye [rows, C] (ye only
// where the expert's output goes through it: not `out`); the backward's bias gradient sums (I, I, C).
template <class T>
struct Scratch {
  int64_t gi, dh, xc, yc;  // the sizes of g and u, d and h, xe, ye
  Storage<T> all;
  T *g, *u, *d, *h, *xe, *ye;
  std::vector<double> dbg, dbu, dbd;
  Scratch(int64_t rows, int64_t C, int64_t I, bool backward, bool ye_too = true)
      : gi(rows * I), dh(backward ? gi : 0), xc(rows * C), yc(backward || ye_too ? xc : 0),
        all(2 * gi + 2 * dh + xc + yc, Role::chunk), g(all.data()), u(g + gi), d(u + gi), h(d + dh), xe(h + dh),
        ye(xe + xc) {}
};

// The gate and up projections of the chunk's rows xe [r, C], with their biases: g, u [r, I].
template <class T>
void project(const Expert<T>& ex, const T* xe, T* g, T* u, int64_t r, int64_t C, int64_t I) {
  gemm<T>(false, true, r, I, C, xe, ex.wg, T(0), g);  // g = xe · Wgᵀ + bg
  gemm<T>(false, true, r, I, C, xe, ex.wu, T(0), u);  // u = xe · Wuᵀ + bu
  add_bias(g, ex.bg, r, I);
  add_bias(u, ex.bu, r, I);
}

// Where an expert's gate and up projections are kept from the forward for the backward: its rows'
// [n, I] blocks of g and u (moe.h's kept[0] and kept[1] from the expert's first place on); null: not kept.
template <class T>
struct Kept {
  T *g = nullptr, *u = nullptr;
  Kept at(int64_t r0, int64_t I) const { return g ? Kept{g + r0 * I, u + r0 * I} : Kept{}; }
};

// y[row] += w · expert(x[row]) for the expert's rows, a chunk at a time; or, with `out` [n, C],
// out[a] = expert(x[row(a)]) (unweighted, in the rows' order) and y untouched. With `kept`, g and u
// go there (and h to the scratch) instead of into the scratch.
template <class T>
void expert_forward(const Rows& all, const T* x, const Expert<T>& ex, T* y, Scratch<T>& s, int64_t C, int64_t I,
                    T* out = nullptr, Kept<T> kept = {}) {
  for (int64_t r0 = 0; r0 < all.n; r0 += kernels::kMlpChunkRows) {
    const Rows rows{all.slot + r0, std::min(kernels::kMlpChunkRows, all.n - r0), all.k, all.weight};
    const int64_t r = rows.n;
    const Kept<T> k = kept.at(r0, I);
    T *g = k.g ? k.g : s.g, *u = k.g ? k.u : s.u, *h = s.g, *ye = out ? out + r0 * C : s.ye;
    gather(rows, x, s.xe, C);
    project(ex, s.xe, g, u, r, C, I);
#pragma omp parallel for schedule(static) if (r * I > kGrain)
    for (int64_t a = 0; a < r; ++a) activate_row(ex, g + a * I, u + a * I, h + a * I, I);
    gemm<T>(false, true, r, C, I, h, ex.wd, T(0), ye);  // ye = h · Wdᵀ + bd
    add_bias(ye, ex.bd, r, C);
    if (!out) scatter_add(rows, ye, y, C, true);
  }
}

// The expert's part of the backward: dx[row] += its dx rows (or, with `out` [n, C], out[a] = row
// a's dx, dx untouched), grad[slot] = dy[row] · ye[slot], and its weight and bias gradients
// (overwritten; zero without rows), a chunk at a time. With `kept`, g and u are copied from there
// into the scratch (which dg and du then overwrite, as recomputed ones) instead of recomputed: a
// chunk's copy is read back from the cache, where one of the whole block would go through memory.
template <class T>
void expert_backward(const Rows& all, const T* dy, const T* x, const Expert<T>& ex, T* dx, double* grad,
                     Scratch<T>& s, int64_t C, int64_t I, T* out = nullptr, Kept<const T> kept = {}) {
  const bool biased = ex.bg != nullptr;
  if (biased) {
    s.dbg.assign(size_t(I), 0.0), s.dbu.assign(size_t(I), 0.0), s.dbd.assign(size_t(C), 0.0);
  }
  if (all.n == 0)
    for (T* dw : {ex.dwg, ex.dwu, ex.dwd}) std::fill(dw, dw + I * C, T(0));
  for (int64_t r0 = 0; r0 < all.n; r0 += kernels::kMlpChunkRows) {
    const Rows rows{all.slot + r0, std::min(kernels::kMlpChunkRows, all.n - r0), all.k, all.weight};
    const int64_t r = rows.n;
    const T beta = r0 == 0 ? T(0) : T(1);  // the first chunk overwrites the weight gradients
    const Kept<const T> k = kept.at(r0, I);
    T *g = s.g, *u = s.u, *d = s.d, *h = s.h, *xe = s.xe, *de = s.ye;
    gather(rows, x, xe, C);
    gather(rows, dy, de, C);
    if (k.g) {
      copy_rows(k.g, g, r, I);
      copy_rows(k.u, u, r, I);
    } else {
      project(ex, xe, g, u, r, C, I);
    }
    gemm<T>(false, false, r, I, C, de, ex.wd, T(0), d);  // d = dy_e · Wd
#pragma omp parallel for schedule(static) if (r * I > kGrain)
    for (int64_t a = 0; a < r; ++a) {
      const int64_t slot = rows.slot[a];
      double dot = activate_grad_row(ex, g + a * I, u + a * I, d + a * I, h + a * I, T(rows.weight[slot]), I);
      if (biased)  // ye = h · Wdᵀ + bd: the bias's share of dy · ye
        for (int64_t c = 0; c < C; ++c) dot += double(de[a * C + c]) * double(ex.bd[c]);
      grad[slot] = dot;
    }
    if (biased) {  // dbd = Σ w·dy_e, dbg = Σ dg, dbu = Σ du
      sum_rows(de, r, C, [&](int64_t a) { return double(T(rows.weight[rows.slot[a]])); }, s.dbd.data());
      sum_rows(g, r, I, [](int64_t) { return 1.0; }, s.dbg.data());
      sum_rows(u, r, I, [](int64_t) { return 1.0; }, s.dbu.data());
    }
    gemm<T>(true, false, C, I, r, de, h, beta, ex.dwd);  // dWd += dy_eᵀ · (w ∘ h)
    T* dxe = out ? out + r0 * C : de;  // dx_e = dg · Wg + du · Wu (into dy_e's buffer without `out`)
    gemm<T>(false, false, r, C, I, g, ex.wg, T(0), dxe);
    gemm<T>(false, false, r, C, I, u, ex.wu, T(1), dxe);
    gemm<T>(true, false, I, C, r, g, xe, beta, ex.dwg);  // dWg += dgᵀ · xe
    gemm<T>(true, false, I, C, r, u, xe, beta, ex.dwu);  // dWu += duᵀ · xe
    if (!out) scatter_add(rows, de, dx, C, false);
  }
  if (biased) {
    std::transform(s.dbg.begin(), s.dbg.end(), ex.dbg, [](double v) { return T(v); });
    std::transform(s.dbu.begin(), s.dbu.end(), ex.dbu, [](double v) { return T(v); });
    std::transform(s.dbd.begin(), s.dbd.end(), ex.dbd, [](double v) { return T(v); });
  }
}

Rows rows_of(const kernels::MoeRouting& r, int64_t e) {
  return Rows{r.slot.data() + r.offset[e], r.rows_of(e), r.k, r.weight.data()};
}

// Expert e's part of moe.h's kept block [2, R·k, I] (null: none).
template <class T>
Kept<T> kept_of(const kernels::MoeRouting& r, T* kept, int64_t e, int64_t I) {
  if (!kept) return {};
  return Kept<T>{kept + r.offset[e] * I, kept + (r.R * r.k + r.offset[e]) * I};
}

int64_t chunk_rows(int64_t rows) { return std::min(rows, kernels::kMlpChunkRows); }

// The rows 0 .. n − 1 of a contiguous block as Rows (slot a is row a), weights w (null: 1).
struct Block {
  std::vector<int64_t> slot;
  std::vector<double> ones;
  Rows rows;
  Block(int64_t n, const double* w) : slot(size_t(n)), ones(w ? 0 : size_t(n), 1.0) {
    for (int64_t a = 0; a < n; ++a) slot[size_t(a)] = a;
    rows = Rows{slot.data(), n, 1, w ? w : ones.data()};
  }
};

// ---- the experts side by side ----

// Side by side, each thread runs whole experts (their GEMMs on that thread alone) and writes
// their output rows to a buffer of R·k rows of C, which a last pass sums per row; one after
// another, each GEMM is split over the threads instead (rows or B panels: either way every
// element of C is the same sum), which at a few hundred rows per expert packs the operands twice
// and waits at a barrier per GEMM. Side by side where every thread gets at least two experts with
// rows and the buffer and the threads' scratch stay under kSideBySideBytes. The GEMMs' bits do
// not depend on their split and the last pass sums in expert order as the scatter does, so both
// ways give the same bits.
constexpr int64_t kSideBySideBytes = int64_t(64) << 20;

// The threads to run r's experts side by side on (1: one after another).
template <class T>
int side_by_side(const kernels::MoeRouting& r, int64_t C, int64_t I, bool backward) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads < 2) return 1;
  int64_t busy = 0;
  for (int64_t e = 0; e < r.E; ++e) busy += r.rows_of(e) > 0;
  const int64_t scratch = chunk_rows(r.max_rows()) * ((backward ? 4 : 2) * I + 2 * C);
  const int64_t bytes = (r.R * r.k * C + threads * scratch) * int64_t(sizeof(T));
  return busy >= 2 * int64_t(threads) && bytes <= kSideBySideBytes ? threads : 1;
}

// The experts in the order threads take them: the most rows first (ties: index order).
std::vector<int64_t> by_rows(const kernels::MoeRouting& r) {
  std::vector<int64_t> order(size_t(r.E));
  for (int64_t e = 0; e < r.E; ++e) order[size_t(e)] = e;
  std::stable_sort(order.begin(), order.end(), [&r](int64_t a, int64_t b) { return r.rows_of(a) > r.rows_of(b); });
  return order;
}

// out [R, C] = Σ over each row's slots, in expert order, of (weighted ? w : 1) · buf[p] (p the
// slot's place in r.slot, where buf holds its expert's output): the sums scatter_add makes expert
// after expert, in the same order (slots sorted by place are sorted by expert).
template <class T>
void combine(const kernels::MoeRouting& r, const T* buf, T* out, int64_t C, bool weighted) {
  std::vector<int64_t> place(r.slot.size());
  for (size_t p = 0; p < r.slot.size(); ++p) place[size_t(r.slot[p])] = int64_t(p);
#pragma omp parallel
  {
    std::vector<int64_t> ps(size_t(r.k));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < r.R; ++row) {
      for (int64_t j = 0; j < r.k; ++j) ps[size_t(j)] = place[size_t(row * r.k + j)];
      std::sort(ps.begin(), ps.end());
      T* o = out + row * C;
      std::fill(o, o + C, T(0));
      for (const int64_t p : ps) {
        const T w = weighted ? T(r.weight[size_t(r.slot[size_t(p)])]) : T(1);
        const T* b = buf + p * C;
        for (int64_t c = 0; c < C; ++c) o[c] += w * b[c];
      }
    }
  }
}

}  // namespace

template <class T>
Expert<T> Expert<T>::of(const T* const* w_gate, const T* const* w_up, const T* const* w_down,
                        const kernels::MoeOptions<T>& opt, int64_t e) {
  Expert<T> ex{.wg = w_gate[e], .wu = w_up[e], .wd = w_down[e]};
  if (opt.b_gate) ex.bg = opt.b_gate[e], ex.bu = opt.b_up[e], ex.bd = opt.b_down[e];
  if (opt.db_gate) ex.dbg = opt.db_gate[e], ex.dbu = opt.db_up[e], ex.dbd = opt.db_down[e];
  ex.clamped = opt.clamped, ex.alpha = opt.alpha, ex.limit = opt.limit;
  return ex;
}

namespace {

// moe_experts_forward, keeping gate and up where `kept` points (null: not kept).
template <class T>
void experts_forward(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up, const T* const* w_down,
                     T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                     const kernels::MoeOptions<T>& opt, T* kept) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  if (const int threads = side_by_side<T>(r, C, I, false); threads > 1) {
    const Storage<T> buf(R * k * C, Role::rows);
    const std::vector<int64_t> order = by_rows(r);
#pragma omp parallel num_threads(threads)
    {
      Scratch<T> s(chunk_rows(r.max_rows()), C, I, false, false);
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < E; ++i) {
        const int64_t e = order[size_t(i)];
        expert_forward(rows_of(r, e), x, Expert<T>::of(w_gate, w_up, w_down, opt, e), y, s, C, I,
                       buf.data() + r.offset[e] * C, kept_of(r, kept, e, I));
      }
    }
    return combine(r, buf.data(), y, C, true);
  }
  Scratch<T> s(chunk_rows(r.max_rows()), C, I, false);
  std::fill(y, y + R * C, T(0));
  for (int64_t e = 0; e < E; ++e)
    expert_forward(rows_of(r, e), x, Expert<T>::of(w_gate, w_up, w_down, opt, e), y, s, C, I, static_cast<T*>(nullptr),
                   kept_of(r, kept, e, I));
}

// moe_experts_backward, from gate and up kept where `kept` points (null: recomputed).
template <class T>
void experts_backward(const T* dy, const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                      const T* const* w_down, T* dx, T* dprobs, T* const* dw_gate, T* const* dw_up, T* const* dw_down,
                      int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                      const kernels::MoeOptions<T>& opt, const T* kept) {
  const kernels::MoeRouting r = kernels::moe_route(probs, R, E, k, norm);
  std::vector<double> g(size_t(R * k));  // the gradient of each slot's weight
  const auto expert = [&](int64_t e) {
    Expert<T> ex = Expert<T>::of(w_gate, w_up, w_down, opt, e);
    ex.dwg = dw_gate[e], ex.dwu = dw_up[e], ex.dwd = dw_down[e];
    return ex;
  };
  if (const int threads = side_by_side<T>(r, C, I, true); threads > 1) {
    const Storage<T> buf(R * k * C, Role::rows);
    const std::vector<int64_t> order = by_rows(r);
#pragma omp parallel num_threads(threads)
    {
      Scratch<T> s(chunk_rows(r.max_rows()), C, I, true);
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < E; ++i) {
        const int64_t e = order[size_t(i)];
        expert_backward(rows_of(r, e), dy, x, expert(e), dx, g.data(), s, C, I, buf.data() + r.offset[e] * C,
                        kept_of(r, kept, e, I));
      }
    }
    combine(r, buf.data(), dx, C, false);
  } else {
    Scratch<T> s(chunk_rows(r.max_rows()), C, I, true);
    std::fill(dx, dx + R * C, T(0));
    for (int64_t e = 0; e < E; ++e)
      expert_backward(rows_of(r, e), dy, x, expert(e), dx, g.data(), s, C, I, static_cast<T*>(nullptr),
                      kept_of(r, kept, e, I));
  }
  kernels::moe_probs_grad(r, norm, g.data(), dprobs);
}

}  // namespace

template <class T>
void moe_experts_forward(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                         const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                         const kernels::MoeOptions<T>& opt) {
  experts_forward(x, probs, w_gate, w_up, w_down, y, R, C, E, I, k, norm, opt, static_cast<T*>(nullptr));
}

template <class T>
void moe_experts_backward(const T* dy, const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                          const T* const* w_down, T* dx, T* dprobs, T* const* dw_gate, T* const* dw_up,
                          T* const* dw_down, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                          const kernels::MoeOptions<T>& opt) {
  experts_backward(dy, x, probs, w_gate, w_up, w_down, dx, dprobs, dw_gate, dw_up, dw_down, R, C, E, I, k, norm, opt,
                   static_cast<const T*>(nullptr));
}

template <class T>
void moe_experts_forward_keeping(const T* x, const T* probs, const T* const* w_gate, const T* const* w_up,
                                 const T* const* w_down, T* y, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k,
                                 bool norm, const kernels::MoeOptions<T>& opt, T* kept) {
  AUTOSP_ASSERT(kept != nullptr, "moe_experts_forward_keeping without a kept block");
  experts_forward(x, probs, w_gate, w_up, w_down, y, R, C, E, I, k, norm, opt, kept);
}

template <class T>
void moe_experts_backward_from_kept(const T* dy, const T* x, const T* probs, const T* const* w_gate,
                                    const T* const* w_up, const T* const* w_down, T* dx, T* dprobs,
                                    T* const* dw_gate, T* const* dw_up, T* const* dw_down, int64_t R, int64_t C,
                                    int64_t E, int64_t I, int64_t k, bool norm, const kernels::MoeOptions<T>& opt,
                                    const T* kept) {
  AUTOSP_ASSERT(kept != nullptr, "moe_experts_backward_from_kept without a kept block");
  experts_backward(dy, x, probs, w_gate, w_up, w_down, dx, dprobs, dw_gate, dw_up, dw_down, R, C, E, I, k, norm, opt,
                   kept);
}

template <class T>
void expert_rows_forward(const T* x, const Expert<T>& ex, T* y, int64_t n, int64_t C, int64_t I) {
  const Block b(n, nullptr);
  Scratch<T> s(chunk_rows(n), C, I, false);
  expert_forward(b.rows, x, ex, y, s, C, I);
}

template <class T>
void expert_rows_backward(const T* dy, const T* x, const double* w, const Expert<T>& ex, T* dx, double* g, int64_t n,
                          int64_t C, int64_t I) {
  const Block b(n, w);
  Scratch<T> s(chunk_rows(n), C, I, true);
  expert_backward(b.rows, dy, x, ex, dx, g, s, C, I);
}

#define AUTOSP_MOE(T)                                                                                                \
  template struct Expert<T>;                                                                                         \
  template void moe_experts_forward<T>(const T*, const T*, const T* const*, const T* const*, const T* const*, T*,    \
                                       int64_t, int64_t, int64_t, int64_t, int64_t, bool,                            \
                                       const kernels::MoeOptions<T>&);                                               \
  template void moe_experts_backward<T>(const T*, const T*, const T*, const T* const*, const T* const*,             \
                                        const T* const*, T*, T*, T* const*, T* const*, T* const*, int64_t, int64_t, \
                                        int64_t, int64_t, int64_t, bool, const kernels::MoeOptions<T>&);             \
  template void moe_experts_forward_keeping<T>(const T*, const T*, const T* const*, const T* const*,                \
                                               const T* const*, T*, int64_t, int64_t, int64_t, int64_t, int64_t,    \
                                               bool, const kernels::MoeOptions<T>&, T*);                            \
  template void moe_experts_backward_from_kept<T>(const T*, const T*, const T*, const T* const*, const T* const*,   \
                                                  const T* const*, T*, T*, T* const*, T* const*, T* const*,         \
                                                  int64_t, int64_t, int64_t, int64_t, int64_t, bool,                \
                                                  const kernels::MoeOptions<T>&, const T*);                         \
  template void expert_rows_forward<T>(const T*, const Expert<T>&, T*, int64_t, int64_t, int64_t);                  \
  template void expert_rows_backward<T>(const T*, const T*, const double*, const Expert<T>&, T*, double*, int64_t,  \
                                        int64_t, int64_t);
AUTOSP_MOE(float)
AUTOSP_MOE(double)
#undef AUTOSP_MOE
template struct Expert<uint16_t>;  // the bf16 kernel's experts (kernels/cpu/moe_bf16.h): bf16 bits

void expert_activation_row(bool clamped, float alpha, float limit, const float* g, const float* u, float* h,
                           int64_t I) {
  if (clamped)
    clamped_row(g, u, h, I, alpha, limit);
  else
    swiglu_row(g, u, h, I);
}

double expert_activation_grad_row(bool clamped, float alpha, float limit, float* g, float* u, const float* d,
                                  float* h, float w, int64_t I) {
  return clamped ? clamped_grad_row(g, u, d, h, w, I, alpha, limit) : swiglu_grad_row(g, u, d, h, w, I);
}

}  // namespace autosp::cpu
