// CPU elementwise kernels: unary maps, broadcasting binary ops, fill and the sums. Knows nothing
// of graphs; broadcasting arrives as strides (0 = broadcast). The strided copy and the dtype
// conversions they share with Tensor are in tensor/strided.cpp and tensor/convert.cpp.
//
// Speed: every strided op first simplifies its index space (drops size-1 dims, merges dims that are
// contiguous for every operand), so the common cases become flat loops: same-shape contiguous
// operands become one rank-1 loop split across threads, a bias [C] over [.., C] becomes rows with a
// unit-stride inner loop. The inner loop has specialisations for strides (1, 1), (1, 0) and (0, 1)
// that the compiler vectorises; threads take contiguous ranges of rows and walk them with an
// odometer instead of dividing per element (tensor/strided_loops.h).
//
// Reductions (sum_to, sum_squares) accumulate in double and split their work by sizes only (fixed
// chunks, partials added in a fixed order; see reduce.h), so results do not depend on the thread
// count. sum_to first simplifies its dims (drops size-1 dims, merges neighbours that are both kept
// or both summed) and then reads x as [L, tail]: L is a leading summed dim (1 if none), split into
// row chunks by sum_rows; the tail's output elements are split into column blocks, each summing
// its contiguous runs. The common cases: same shape is a copy; a bias gradient [rows, C] → [C] is
// L = rows with a contiguous tail, whose chunk of rows is summed a block of 64 columns at a time in
// registers (add_rows_f32: acc is read and written once per block, not once per row); summing
// everything is one chunked contiguous sum.
#include "kernels/cpu/elementwise.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "kernels/cpu/vec16.h"
#include "tensor/check.h"
#include "tensor/strided_loops.h"

namespace autosp::cpu {

namespace {

// ---- unary -----------------------------------------------------------------------------------

// gelu_tanh and its derivative, shared by the plain and the fused (bias) kernels so both give the
// same bits. 0.5·(1 + tanh(u)) = sigmoid(2u): one exp instead of a (slower) tanh, no cancellation.
// f = x·s, s = sigmoid(2u), u = k·(x + a·x³), k = √(2/π), a = 0.044715;
// f' = s + x·(1 - tanh²u)/2·u' = s + 2·x·s·(1 - s)·k·(1 + 3a·x²). s saturates to 0 or 1 without NaN.
template <class T>
inline T gelu_tanh_of(T v) {
  const T two_k = T(2 * 0.7978845608028654);  // 2·√(2/π)
  return v / (T(1) + std::exp(-two_k * (v + T(0.044715) * v * v * v)));
}
template <class T>
inline T gelu_tanh_grad(T v) {
  const T k = T(0.7978845608028654), a = T(0.044715);
  const T sg = T(1) / (T(1) + std::exp(T(-2) * k * (v + a * v * v * v)));
  return sg + T(2) * v * sg * (T(1) - sg) * k * (T(1) + T(3) * a * v * v);
}

// The same two in f32 over 16 lanes with vec16's exp16 (~1 ulp; compiled per ISA), for a run of n
// entries: y = gelu_tanh(x + b) and dx = dy · gelu_tanh'(x + b), where b (a bias row) may be null.
// Every f32 gelu_tanh kernel, plain or fused, goes through these, so they too give the same bits.
using vec16::f32x16;
[[gnu::always_inline]] inline f32x16 gelu_tanh16(f32x16 v) {
  return v / (1.0f + vec16::exp16(float(-2 * 0.7978845608028654) * (v + 0.044715f * v * v * v)));
}
[[gnu::always_inline]] inline f32x16 gelu_tanh_grad16(f32x16 v) {
  const float k = 0.7978845608028654f, a = 0.044715f;
  const f32x16 sg = 1.0f / (1.0f + vec16::exp16(-2.0f * k * (v + a * v * v * v)));
  return sg + 2.0f * v * sg * (1.0f - sg) * k * (1.0f + 3.0f * a * v * v);
}
AUTOSP_VEC16_CLONES void gelu_tanh_run(const float* x, const float* b, float* y, int64_t n) {
  using vec16::load, vec16::load_part;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vec16::store(y + i, gelu_tanh16(b ? load(x + i) + load(b + i) : load(x + i)));
  if (i < n) {
    const f32x16 v = b ? load_part(x + i, n - i, 0.0f) + load_part(b + i, n - i, 0.0f) : load_part(x + i, n - i, 0.0f);
    vec16::store_part(y + i, gelu_tanh16(v), n - i);
  }
}
AUTOSP_VEC16_CLONES void gelu_tanh_grad_run(const float* dy, const float* x, const float* b, float* dx, int64_t n) {
  using vec16::load, vec16::load_part;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    vec16::store(dx + i, load(dy + i) * gelu_tanh_grad16(b ? load(x + i) + load(b + i) : load(x + i)));
  if (i < n) {
    const f32x16 v = b ? load_part(x + i, n - i, 0.0f) + load_part(b + i, n - i, 0.0f) : load_part(x + i, n - i, 0.0f);
    vec16::store_part(dx + i, load_part(dy + i, n - i, 0.0f) * gelu_tanh_grad16(v), n - i);
  }
}
constexpr int64_t kRun = 4096;  // plain (bias-free) f32 gelu and SwiGLU: threads take runs of this many entries

// SwiGLU and its gradient at one entry (T = double, the gradient-check dtype) or 16 lanes (f32,
// exp16, compiled per ISA): the same formulas, so the scalar and vector paths read alike.
// s = sigmoid(g); h = g·s·u; dg = dy·u·s·(1 + g·(1 - s)), du = dy·g·s. exp16 is 0 below -87.3
// and clamps above 88.4, so s saturates to 0 or 1 without NaN.
template <class V>
[[gnu::always_inline]] inline V sigmoid_of(V v) {
  if constexpr (std::is_same_v<V, f32x16>) return 1.0f / (1.0f + vec16::exp16(-v));
  else return V(1) / (V(1) + std::exp(-v));
}
template <class V>
[[gnu::always_inline]] inline void swiglu_grad_at(V g, V u, V dy, V& dg, V& du) {
  const V s = sigmoid_of(g);
  dg = dy * u * (s * (1 + g * (1 - s)));
  du = dy * (g * s);
}
AUTOSP_VEC16_CLONES void swiglu_run(const float* g, const float* u, float* h, int64_t n) {
  using vec16::load, vec16::load_part;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const f32x16 gv = load(g + i);
    vec16::store(h + i, gv * sigmoid_of(gv) * load(u + i));
  }
  if (i < n) {
    const f32x16 gv = load_part(g + i, n - i, 0.0f);
    vec16::store_part(h + i, gv * sigmoid_of(gv) * load_part(u + i, n - i, 0.0f), n - i);
  }
}
AUTOSP_VEC16_CLONES void swiglu_grad_run(const float* dy, const float* g, const float* u, float* dg, float* du,
                                         int64_t n) {
  using vec16::load, vec16::load_part;
  f32x16 dgv, duv;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    swiglu_grad_at(load(g + i), load(u + i), load(dy + i), dgv, duv);
    vec16::store(dg + i, dgv), vec16::store(du + i, duv);
  }
  if (i < n) {
    const int64_t m = n - i;
    swiglu_grad_at(load_part(g + i, m, 0.0f), load_part(u + i, m, 0.0f), load_part(dy + i, m, 0.0f), dgv, duv);
    vec16::store_part(dg + i, dgv, m), vec16::store_part(du + i, duv, m);
  }
}


template <class T, class F>
void map(const T* x, T* y, int64_t n, F f) {
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

// ---- binary ----------------------------------------------------------------------------------

struct Add {
  template <class T> T operator()(T a, T b) const { return a + b; }
};
struct Sub {
  template <class T> T operator()(T a, T b) const { return a - b; }
};
struct Mul {
  template <class T> T operator()(T a, T b) const { return a * b; }
};
struct Div {
  template <class T> T operator()(T a, T b) const { return a / b; }
};
struct Max {  // NaN-propagating, like torch.maximum
  template <class T> T operator()(T a, T b) const { return (a > b || a != a) ? a : b; }
};
struct Min {
  template <class T> T operator()(T a, T b) const { return (a < b || a != a) ? a : b; }
};

template <class T, class Op>
void binary_run(Op op, const T* a, int64_t sa, const T* b, int64_t sb, T* out, int64_t n) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = op(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const T bv = *b;
    for (int64_t i = 0; i < n; ++i) out[i] = op(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const T av = *a;
    for (int64_t i = 0; i < n; ++i) out[i] = op(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = op(a[i * sa], b[i * sb]);
  }
}

template <class T, class Op>
void binary_op(Op op, int rank, const int64_t* out_shape, const T* a, const int64_t* a_strides,
               const T* b, const int64_t* b_strides, T* out) {
  const int64_t* strides[2] = {a_strides, b_strides};
  const Space s = simplify_space(rank, out_shape, 2, strides);
  if (s.numel == 0) return;
  for_each_run(s, 2, [&](int64_t o, const int64_t* off, int64_t n, const int64_t* st) {
    binary_run(op, a + off[0], st[0], b + off[1], st[1], out + o, n);
  });
}

// ---- reductions ------------------------------------------------------------------------------

// f32 runs summed in double over 8-lane vectors (one clone per ISA, vec16.h): each f32 is widened
// exactly and added (or its square fused) into 32 double lanes, 4 vectors of 8, summed in a fixed
// order at the end, so the bits do not depend on the clone. 3.5M squares (GPT-2 tiny's gradient
// norm) take ~0.5 ms instead of ~1.2 with four scalar partial sums (docs/decisions.md 259).
using f32x8 = float __attribute__((vector_size(32)));
using f64x8 = double __attribute__((vector_size(64)));
[[gnu::always_inline]] inline f64x8 widen8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, f64x8);
}
template <bool kSquare>
[[gnu::always_inline]] inline double run_sum_f32_body(const float* x, int64_t n) {
  f64x8 s[4] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      const f64x8 v = widen8(x + i + 8 * k);
      s[k] += kSquare ? v * v : v;
    }
  for (; i + 8 <= n; i += 8) {
    const f64x8 v = widen8(x + i);
    s[0] += kSquare ? v * v : v;
  }
  const f64x8 t = (s[0] + s[1]) + (s[2] + s[3]);
  double total = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  for (; i < n; ++i) total += kSquare ? double(x[i]) * double(x[i]) : double(x[i]);
  return total;
}
AUTOSP_VEC16_CLONES double run_sum_f32(const float* x, int64_t n, bool square) {
  return square ? run_sum_f32_body<true>(x, n) : run_sum_f32_body<false>(x, n);
}
// acc[i] += x[i] widened, for a bias gradient's rows: the same additions, in the same order per
// column, as the scalar loop, so the same bits, 8 lanes at a time.
AUTOSP_VEC16_CLONES void add_row_f32(const float* x, double* acc, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f64x8 a;
    std::memcpy(&a, acc + i, sizeof a);
    a += widen8(x + i);
    std::memcpy(acc + i, &a, sizeof a);
  }
  for (; i < n; ++i) acc[i] += double(x[i]);
}
// acc[c] += Σ_{r < nrows} x[r·ld + c] for c < n, the rows added in order: the same additions per
// column as add_row_f32 over the rows one after another (the same bits), but each block of 64
// columns is summed over all the rows in registers, so acc is read and written once per block
// instead of once per row.
AUTOSP_VEC16_CLONES void add_rows_f32(const float* x, int64_t ld, int64_t nrows, double* acc, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    f64x8 a[8];
    std::memcpy(a, acc + i, sizeof a);
    for (int64_t r = 0; r < nrows; ++r)
      for (int k = 0; k < 8; ++k) a[k] += widen8(x + r * ld + i + 8 * k);
    std::memcpy(acc + i, a, sizeof a);
  }
  for (; i + 8 <= n; i += 8) {
    f64x8 a;
    std::memcpy(&a, acc + i, sizeof a);
    for (int64_t r = 0; r < nrows; ++r) a += widen8(x + r * ld + i);
    std::memcpy(acc + i, &a, sizeof a);
  }
  for (; i < n; ++i) {
    double a = acc[i];
    for (int64_t r = 0; r < nrows; ++r) a += double(x[r * ld + i]);
    acc[i] = a;
  }
}

// Σ_{i < n} f(x[i]) in double, four partial sums.
template <class T, class F>
double run_sum(const T* x, int64_t n, F f) {
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += f(detail::sum_input(x[i + k]));
  for (; i < n; ++i) s[0] += f(detail::sum_input(x[i]));
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Σ_{i < n} x[i] (or x[i]², `square`) over fixed chunks (from n alone) summed in parallel and added
// in chunk order; f32 chunks over double lanes (run_sum_f32), others by run_sum.
template <class T>
double chunked_sum(const T* x, int64_t n, bool square) {
  const int64_t nchunks = std::clamp<int64_t>(n / kGrain, 1, 64);
  std::vector<double> part(static_cast<size_t>(nchunks));
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t lo = n * ch / nchunks, hi = n * (ch + 1) / nchunks;
    if constexpr (std::is_same_v<T, float>)
      part[ch] = run_sum_f32(x + lo, hi - lo, square);
    else
      part[ch] = square ? run_sum(x + lo, hi - lo, [](double v) { return v * v; })
                        : run_sum(x + lo, hi - lo, [](double v) { return v; });
  }
  double total = 0;
  for (double p : part) total += p;
  return total;
}

}  // namespace

template <class T>
void unary_backward(UnaryGrad op, const T* dy, const T* x, T* dx, int64_t n) {
  AUTOSP_ASSERT(n >= 0, "unary_backward n ", n);
  switch (op) {
    case UnaryGrad::gelu_tanh: {
      if constexpr (std::is_same_v<T, float>) {
#pragma omp parallel for schedule(static) if (n > kGrain)
        for (int64_t i = 0; i < n; i += kRun) gelu_tanh_grad_run(dy + i, x + i, nullptr, dx + i, std::min(kRun, n - i));
        return;
      }
#pragma omp parallel for schedule(static) if (n > kGrain)
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
      return;
    }
    case UnaryGrad::silu: {
      // f = x·s, s = sigmoid(x); f' = s·(1 + x·(1 - s)).
#pragma omp parallel for schedule(static) if (n > kGrain)
      for (int64_t i = 0; i < n; ++i) {
        const T v = x[i];
        const T sg = T(1) / (T(1) + std::exp(-v));
        dx[i] = dy[i] * (sg * (T(1) + v * (T(1) - sg)));
      }
      return;
    }
  }
  AUTOSP_ASSERT(false, "unknown unary grad op ", int(op));
}

template <class T>
void sum_to(const T* x, int rank, const int64_t* x_shape, const int64_t* out_shape, T* out) {
  const auto [n, size, summed, x_numel, out_numel] = simplify_sum(rank, x_shape, out_shape);  // simplified dims
  if (x_numel == 0) return fill(out, out_numel, T(0));
  if (n == 0 || (n == 1 && !summed[0])) {  // nothing is summed: a copy
    const int64_t unit = 1;
    return copy_strided(1, &x_numel, x, &unit, out);
  }
  if (n == 1) {  // everything is summed
    out[0] = detail::sum_output<T>(chunked_sum(x, x_numel, false));
    return;
  }

  // x = [L, tail]; L is the leading summed dim (1 if the first dim is kept).
  const int64_t L = summed[0] ? size[0] : 1;
  const int t0 = summed[0] ? 1 : 0;  // first tail dim
  const bool inner_summed = summed[n - 1];
  const int64_t W = inner_summed ? 1 : size[n - 1];    // outputs per contiguous run
  const int64_t run = inner_summed ? size[n - 1] : W;  // elements per contiguous run
  // Outer tail dims [t0, n-1): kept ones index the output rows, summed ones are walked by an
  // odometer. stride[d] is x's contiguous stride of dim d.
  int64_t stride[kMaxRank];
  stride[n - 1] = 1;
  for (int d = n - 2; d >= 0; --d) stride[d] = stride[d + 1] * size[d + 1];
  int nk = 0, ns = 0;
  int64_t ksize[kMaxRank], kstride[kMaxRank], ssize[kMaxRank], sstride[kMaxRank];
  int64_t tail_out = W, tail_runs = 1;  // output elements and contiguous runs summed per output
  for (int d = t0; d < n - 1; ++d) {
    if (summed[d]) {
      ssize[ns] = size[d], sstride[ns] = stride[d], ++ns;
      tail_runs *= size[d];
    } else {
      ksize[nk] = size[d], kstride[nk] = stride[d], ++nk;
      tail_out *= size[d];
    }
  }
  const int64_t lstride = summed[0] ? stride[0] : 0;

  std::vector<double> acc_out(static_cast<size_t>(tail_out));  // [tail_out]
  // Adds x[l] to acc for the output elements [c0, c1) (indexed [rows of the kept dims, W]).
  auto add = [&](int64_t l, int64_t c0, int64_t c1, double* acc) {
    for (int64_t row = c0 / W; row * W < c1; ++row) {
      int64_t base = l * lstride;
      for (int64_t rem = row, d = nk - 1; d >= 0; --d) {
        base += (rem % ksize[d]) * kstride[d];
        rem /= ksize[d];
      }
      const int64_t w0 = std::max(c0 - row * W, int64_t(0)), w1 = std::min(c1 - row * W, W);
      double* a = acc + row * W;
      int64_t idx[kMaxRank] = {};  // odometer over the summed outer tail dims
      for (int64_t s = 0, off = base; s < tail_runs; ++s) {
        const T* xr = x + off;
        if (inner_summed) {
          a[0] += run_sum(xr, run, [](double v) { return v; });
        } else if constexpr (std::is_same_v<T, float>) {
          add_row_f32(xr + w0, a + w0, w1 - w0);
        } else {
          for (int64_t w = w0; w < w1; ++w) a[w] += detail::sum_input(xr[w]);
        }
        for (int d = ns - 1; d >= 0; --d) {
          off += sstride[d];
          if (++idx[d] < ssize[d]) break;
          off -= idx[d] * sstride[d];
          idx[d] = 0;
        }
      }
    }
  };
  if (ns == 0 && nk == 0 && !inner_summed) {
    // x = [L, W] (a bias gradient): a chunk's rows at once, the same additions as `add` row by row.
    detail::sum_row_blocks(L, W, 1, 1, false, acc_out.data(),
                           [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, double* acc) {
                             const T* xr = x + r0 * W + c0;  // [r1 - r0, W]
                             if constexpr (std::is_same_v<T, float>) {
                               add_rows_f32(xr, W, r1 - r0, acc + c0, c1 - c0);
                             } else {
                               for (int64_t r = 0; r < r1 - r0; ++r)
                                 for (int64_t c = 0; c < c1 - c0; ++c) acc[c0 + c] += detail::sum_input(xr[r * W + c]);
                             }
                           });
  } else {
    detail::sum_rows(L, tail_out, 1, tail_runs * (inner_summed ? run : 1), acc_out.data(), add);
  }
#pragma omp parallel for schedule(static) if (tail_out > kGrain)
  for (int64_t i = 0; i < tail_out; ++i) out[i] = detail::sum_output<T>(acc_out[i]);
}

template <class T>
void bias_gelu_tanh(const T* x, const T* b, T* y, int64_t rows, int64_t C) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "bias_gelu_tanh rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;  // [C]
    T* yr = y + r * C;
    if constexpr (std::is_same_v<T, float>) gelu_tanh_run(xr, b, yr, C);
    else for (int64_t c = 0; c < C; ++c) yr[c] = gelu_tanh_of(T(xr[c] + b[c]));
  }
}

template <class T>
void bias_gelu_tanh_backward(const T* dy, const T* x, const T* b, T* dx, int64_t rows, int64_t C) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "bias_gelu_tanh_backward rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T *xr = x + r * C, *dyr = dy + r * C;  // [C]
    T* dxr = dx + r * C;
    if constexpr (std::is_same_v<T, float>) gelu_tanh_grad_run(dyr, xr, b, dxr, C);
    else for (int64_t c = 0; c < C; ++c) dxr[c] = dyr[c] * gelu_tanh_grad(T(xr[c] + b[c]));
  }
}

template <class T>
void swiglu(const T* g, const T* u, T* h, int64_t n) {
  AUTOSP_ASSERT(n >= 0, "swiglu n ", n);
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; i += kRun) {
    const int64_t m = std::min(kRun, n - i);
    if constexpr (std::is_same_v<T, float>) swiglu_run(g + i, u + i, h + i, m);
    else for (int64_t j = i; j < i + m; ++j) h[j] = g[j] * sigmoid_of(g[j]) * u[j];
  }
}

template <class T>
void swiglu_backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n) {
  AUTOSP_ASSERT(n >= 0, "swiglu_backward n ", n);
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; i += kRun) {
    const int64_t m = std::min(kRun, n - i);
    if constexpr (std::is_same_v<T, float>) swiglu_grad_run(dy + i, g + i, u + i, dg + i, du + i, m);
    else for (int64_t j = i; j < i + m; ++j) swiglu_grad_at(g[j], u[j], dy[j], dg[j], du[j]);
  }
}

template <class T>
void dropout(const T* x, const int64_t* token, T* y, int64_t rows, int64_t C, uint64_t seed, uint64_t threshold,
             double scale) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "dropout rows ", rows, " C ", C);
  const T s = T(scale);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t row = kernels::dropout_row(seed, token[r]);
    const T* xr = x + r * C;  // [C]
    T* yr = y + r * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = kernels::dropout_keep(row, c, threshold) ? xr[c] * s : T(0);
  }
}

template <class T>
double sum_squares(const T* x, int64_t n) {
  AUTOSP_ASSERT(n >= 0, "sum_squares n ", n);
  return chunked_sum(x, n, true);
}

template <class T>
void unary(Unary op, const T* x, T* y, int64_t n, double scalar) {
  switch (op) {
    case Unary::neg: return map(x, y, n, [](T v) { return -v; });
    case Unary::exp: return map(x, y, n, [](T v) { return std::exp(v); });
    case Unary::log: return map(x, y, n, [](T v) { return std::log(v); });
    case Unary::tanh: return map(x, y, n, [](T v) { return std::tanh(v); });
    case Unary::sqrt: return map(x, y, n, [](T v) { return std::sqrt(v); });
    case Unary::rsqrt: return map(x, y, n, [](T v) { return T(1) / std::sqrt(v); });
    case Unary::square: return map(x, y, n, [](T v) { return v * v; });
    case Unary::gelu_tanh:
      if constexpr (std::is_same_v<T, float>) {
#pragma omp parallel for schedule(static) if (n > kGrain)
        for (int64_t i = 0; i < n; i += kRun) gelu_tanh_run(x + i, nullptr, y + i, std::min(kRun, n - i));
        return;
      }
      return map(x, y, n, [](T v) { return gelu_tanh_of(v); });
    case Unary::silu: return map(x, y, n, [](T v) { return v / (T(1) + std::exp(-v)); });
    case Unary::scale: {
      const T s = T(scalar);
      return map(x, y, n, [s](T v) { return v * s; });
    }
    case Unary::relu: return map(x, y, n, [](T v) { return v < T(0) ? T(0) : v; });
  }
  AUTOSP_ASSERT(false, "unknown unary op ", int(op));
}

template <class T>
void binary(Binary op, int rank, const int64_t* out_shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out) {
  switch (op) {
    case Binary::add: return binary_op(Add{}, rank, out_shape, a, a_strides, b, b_strides, out);
    case Binary::sub: return binary_op(Sub{}, rank, out_shape, a, a_strides, b, b_strides, out);
    case Binary::mul: return binary_op(Mul{}, rank, out_shape, a, a_strides, b, b_strides, out);
    case Binary::div: return binary_op(Div{}, rank, out_shape, a, a_strides, b, b_strides, out);
    case Binary::max: return binary_op(Max{}, rank, out_shape, a, a_strides, b, b_strides, out);
    case Binary::min: return binary_op(Min{}, rank, out_shape, a, a_strides, b, b_strides, out);
  }
  AUTOSP_ASSERT(false, "unknown binary op ", int(op));
}

// Blocks of kRows positions of one sequence per task: for each part and head, the block's D runs
// are copied between the rows of x (kRows · 3·N·D, which stay in cache) and one contiguous
// [kRows, D] stretch of the head's [S, D], so both sides stream. One parallel region per call.
constexpr int64_t kHeadRows = 32;

template <class T>
void qkv_heads(const T* x, const T* b, T* q, T* k, T* v, int64_t B, int64_t S, int64_t N, int64_t D) {
  AUTOSP_ASSERT(B >= 0 && S >= 0 && N > 0 && D > 0, "qkv_heads B ", B, " S ", S, " N ", N, " D ", D);
  const int64_t C = N * D, blocks = (S + kHeadRows - 1) / kHeadRows;
  T* out[3] = {q, k, v};
#pragma omp parallel for schedule(static) if (B * S * 3 * C > kGrain)
  for (int64_t task = 0; task < B * blocks; ++task) {
    const int64_t bi = task / blocks, s0 = (task % blocks) * kHeadRows, s1 = std::min(S, s0 + kHeadRows);
    for (int64_t p = 0; p < 3; ++p)
      for (int64_t n = 0; n < N; ++n) {
        const T* bs = b + p * C + n * D;  // [D]
        T* o = out[p] + (bi * N + n) * S * D;  // [S, D]
        for (int64_t si = s0; si < s1; ++si) {
          const T* xs = x + (bi * S + si) * 3 * C + p * C + n * D;
          T* os = o + si * D;
          for (int64_t d = 0; d < D; ++d) os[d] = xs[d] + bs[d];
        }
      }
  }
}

// The backward by blocks of rows inside sum_row_blocks (the bias gradient's chunks and column
// blocks, as sum_to's over [B·S, 3·N·D]: the same bits): for the rows of one sequence in a chunk,
// each head's run of D columns is one contiguous [rows, D] stretch of dq, dk or dv, copied into
// dx's rows and summed over its rows in registers, so both sides stream as in the forward.
template <class T>
void qkv_heads_backward(const T* dq, const T* dk, const T* dv, T* dx, T* db, int64_t B, int64_t S, int64_t N,
                        int64_t D) {
  AUTOSP_ASSERT(B >= 0 && S >= 0 && N > 0 && D > 0, "qkv_heads_backward B ", B, " S ", S, " N ", N, " D ", D);
  const int64_t C = N * D, W = 3 * C;
  const T* in[3] = {dq, dk, dv};
  std::vector<double> acc_out(static_cast<size_t>(W), 0.0);  // [3·N·D]
  detail::sum_row_blocks(B * S, W, 1, 1, false, acc_out.data(),
                         [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, double* acc) {
    for (int64_t r = r0; r < r1;) {  // the chunk's rows of one sequence: [r, r + m)
      const int64_t bi = r / S, si = r % S, m = std::min(r1 - r, S - si);
      for (int64_t c = c0; c < c1;) {  // one head's run of D (or what of it lies in [c0, c1))
        const int64_t p = c / C, h = (c % C) / D, d = c % D, len = std::min(D - d, c1 - c);
        const T* src = in[p] + ((bi * N + h) * S + si) * D + d;  // [m, D], `len` columns of each row
        T* dst = dx + r * W + c;                                 // [m, W]
        for (int64_t i = 0; i < m; ++i) std::copy_n(src + i * D, len, dst + i * W);
        if constexpr (std::is_same_v<T, float>) {
          add_rows_f32(src, D, m, acc + c, len);
        } else {
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < len; ++j) acc[c + j] += double(src[i * D + j]);
        }
        c += len;
      }
      r += m;
    }
  });
  for (int64_t c = 0; c < W; ++c) db[c] = detail::sum_output<T>(acc_out[c]);
}

template <class T>
void fill(T* dst, int64_t n, T value) {
#pragma omp parallel if (n > kGrain)
  {
    int64_t lo, hi;
    thread_range(n, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
    std::fill(dst + lo, dst + hi, value);
  }
}

#define AUTOSP_INSTANTIATE_FLOAT(T)                                                                   \
  template void unary<T>(Unary, const T*, T*, int64_t, double);                                     \
  template void binary<T>(Binary, int, const int64_t*, const T*, const int64_t*, const T*,          \
                          const int64_t*, T*);                                                      \
  template void unary_backward<T>(UnaryGrad, const T*, const T*, T*, int64_t);                      \
  template void bias_gelu_tanh<T>(const T*, const T*, T*, int64_t, int64_t);                        \
  template void bias_gelu_tanh_backward<T>(const T*, const T*, const T*, T*, int64_t, int64_t);     \
  template void swiglu<T>(const T*, const T*, T*, int64_t);                                         \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);                  \
  template void sum_to<T>(const T*, int, const int64_t*, const int64_t*, T*);                       \
  template void dropout<T>(const T*, const int64_t*, T*, int64_t, int64_t, uint64_t, uint64_t, double); \
  template double sum_squares<T>(const T*, int64_t);                                                 \
  template void qkv_heads<T>(const T*, const T*, T*, T*, T*, int64_t, int64_t, int64_t, int64_t);   \
  template void qkv_heads_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t, int64_t);
AUTOSP_INSTANTIATE_FLOAT(float)
AUTOSP_INSTANTIATE_FLOAT(double)
#undef AUTOSP_INSTANTIATE_FLOAT

template void sum_to<uint16_t>(const uint16_t*, int, const int64_t*, const int64_t*, uint16_t*);
template void fill<float>(float*, int64_t, float);
template void fill<double>(double*, int64_t, double);
template void fill<int32_t>(int32_t*, int64_t, int32_t);
template void fill<int64_t>(int64_t*, int64_t, int64_t);
template void fill<uint16_t>(uint16_t*, int64_t, uint16_t);

}  // namespace autosp::cpu
