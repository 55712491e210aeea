// CPU elementwise kernels: unary maps, broadcasting binary ops, strided copies, fill and the
// bf16 / f16 conversions. Knows nothing of graphs; broadcasting arrives as strides (0 = broadcast).
//
// Speed: every strided op first simplifies its index space (drops size-1 dims, merges dims that are
// contiguous for every operand), so the common cases become flat loops: same-shape contiguous
// operands become one rank-1 loop split across threads, a bias [C] over [.., C] becomes rows with a
// unit-stride inner loop. The inner loop has specialisations for strides (1, 1), (1, 0) and (0, 1)
// that the compiler vectorises; threads take contiguous ranges of rows and walk them with an
// odometer instead of dividing per element.
//
// Reductions (sum_to, sum_squares) accumulate in double and split their work by sizes only (fixed
// chunks, partials added in a fixed order; see reduce.h), so results do not depend on the thread
// count. sum_to first simplifies its dims (drops size-1 dims, merges neighbours that are both kept
// or both summed) and then reads x as [L, tail]: L is a leading summed dim (1 if none), split into
// row chunks by sum_rows; the tail's output elements are split into column blocks, each summing
// its contiguous runs. The common cases: same shape is a copy; a bias gradient [rows, C] → [C] is
// L = rows with a contiguous tail; summing everything is one chunked contiguous sum.
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/strided_space.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "tensor/check.h"

namespace autosp::cpu {

namespace {

constexpr int64_t kGrain = 1 << 15;  // elements below which a kernel runs on one thread

// [lo, hi) of n items for thread t of nt.
inline void thread_range(int64_t n, int t, int nt, int64_t& lo, int64_t& hi) {
  lo = n * t / nt;
  hi = n * (t + 1) / nt;
}

// Calls f(out_offset, op_offsets, n, op_inner_strides) for runs of the innermost dim, split over
// threads. out_offset is the linear index (the output is contiguous over the space).
template <class F>
void for_each_run(const Space& s, int nops, F f) {
  const int r = s.rank;
  const int64_t inner = s.shape[r - 1];
  int64_t inner_stride[2] = {s.stride[0][r - 1], s.stride[1][r - 1]};
  if (r == 1) {  // one flat run: split it
#pragma omp parallel if (s.numel > kGrain)
    {
      int64_t lo, hi;
      thread_range(inner, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
      if (hi > lo) {
        int64_t off[2] = {lo * inner_stride[0], lo * inner_stride[1]};
        f(lo, off, hi - lo, inner_stride);
      }
    }
    return;
  }
  const int64_t rows = s.numel / inner;
#pragma omp parallel if (s.numel > kGrain)
  {
    int64_t lo, hi;
    thread_range(rows, omp_get_thread_num(), omp_get_num_threads(), lo, hi);
    if (hi > lo) {
      int64_t idx[kMaxRank] = {};  // odometer over the outer dims [0, r-1)
      int64_t off[2] = {0, 0};
      for (int64_t rem = lo, d = r - 2; d >= 0; --d) {
        idx[d] = rem % s.shape[d];
        rem /= s.shape[d];
        for (int o = 0; o < nops; ++o) off[o] += idx[d] * s.stride[o][d];
      }
      for (int64_t row = lo; row < hi; ++row) {
        f(row * inner, off, inner, inner_stride);
        for (int d = r - 2; d >= 0; --d) {  // advance the odometer
          for (int o = 0; o < nops; ++o) off[o] += s.stride[o][d];
          if (++idx[d] < s.shape[d]) break;
          for (int o = 0; o < nops; ++o) off[o] -= idx[d] * s.stride[o][d];
          idx[d] = 0;
        }
      }
    }
  }
}

// A transpose-like copy: the innermost dim reads src with a stride while dim p reads it densely.
// Copies (p, inner) in kTile × kTile tiles, so the src lines a tile touches are reused from cache
// instead of being fetched once per element.
template <class T>
void copy_tiled(const Space& s, int p, const T* src, T* dst) {
  constexpr int64_t kTile = 32;
  const int r = s.rank;
  int64_t dst_stride[kMaxRank];  // dst is contiguous over s.shape
  dst_stride[r - 1] = 1;
  for (int d = r - 2; d >= 0; --d) dst_stride[d] = dst_stride[d + 1] * s.shape[d + 1];
  const int64_t np = s.shape[p], nj = s.shape[r - 1], sj = s.stride[0][r - 1], dp = dst_stride[p];
  const int64_t ptiles = (np + kTile - 1) / kTile, outer = s.numel / (np * nj);
#pragma omp parallel for schedule(static) if (s.numel > kGrain)
  for (int64_t task = 0; task < outer * ptiles; ++task) {
    int64_t src_off = 0, dst_off = 0;  // of this task's outer index (all dims but p and inner)
    for (int64_t rem = task / ptiles, d = r - 2; d >= 0; --d) {
      if (d == p) continue;
      const int64_t i = rem % s.shape[d];
      rem /= s.shape[d];
      src_off += i * s.stride[0][d];
      dst_off += i * dst_stride[d];
    }
    const int64_t p0 = (task % ptiles) * kTile, p1 = std::min(np, p0 + kTile);
    for (int64_t j0 = 0; j0 < nj; j0 += kTile) {
      const int64_t j1 = std::min(nj, j0 + kTile);
      for (int64_t pp = p0; pp < p1; ++pp) {
        const T* from = src + src_off + pp;  // src stride along p is 1
        T* to = dst + dst_off + pp * dp;
        for (int64_t j = j0; j < j1; ++j) to[j] = from[j * sj];
      }
    }
  }
}

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
  const Space s = simplify(rank, out_shape, 2, strides);
  if (s.numel == 0) return;
  for_each_run(s, 2, [&](int64_t o, const int64_t* off, int64_t n, const int64_t* st) {
    binary_run(op, a + off[0], st[0], b + off[1], st[1], out + o, n);
  });
}

// ---- reductions ------------------------------------------------------------------------------

// Σ_{i < n} f(x[i]) in double, four partial sums.
template <class T, class F>
double run_sum(const T* x, int64_t n, F f) {
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += f(double(x[i + k]));
  for (; i < n; ++i) s[0] += f(double(x[i]));
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Σ_{i < n} f(x[i]) over fixed chunks (from n alone) summed in parallel and added in chunk order.
template <class T, class F>
double chunked_sum(const T* x, int64_t n, F f) {
  const int64_t nchunks = std::clamp<int64_t>(n / kGrain, 1, 64);
  std::vector<double> part(static_cast<size_t>(nchunks));
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t lo = n * ch / nchunks, hi = n * (ch + 1) / nchunks;
    part[ch] = run_sum(x + lo, hi - lo, f);
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
  AUTOSP_ASSERT(rank >= 0 && rank <= kMaxRank, "sum_to rank ", rank);
  // Simplified dims: size-1 dims dropped, neighbours with the same kind (kept / summed) merged.
  int n = 0;
  int64_t size[kMaxRank];
  bool summed[kMaxRank];
  int64_t x_numel = 1, out_numel = 1;
  for (int d = 0; d < rank; ++d) {
    AUTOSP_ASSERT(x_shape[d] >= 0 && (out_shape[d] == x_shape[d] || out_shape[d] == 1),
                  "sum_to dim ", d, ": x ", x_shape[d], " out ", out_shape[d]);
    x_numel *= x_shape[d];
    out_numel *= out_shape[d];
    if (x_shape[d] == 1) continue;
    const bool s = out_shape[d] == 1;
    if (n > 0 && summed[n - 1] == s) {
      size[n - 1] *= x_shape[d];
    } else {
      size[n] = x_shape[d];
      summed[n] = s;
      ++n;
    }
  }
  if (x_numel == 0) return fill(out, out_numel, T(0));
  if (n == 0 || (n == 1 && !summed[0])) {  // nothing is summed: a copy
    const int64_t unit = 1;
    return copy_strided(1, &x_numel, x, &unit, out);
  }
  if (n == 1) {  // everything is summed
    out[0] = T(chunked_sum(x, x_numel, [](double v) { return v; }));
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
        } else {
          for (int64_t w = w0; w < w1; ++w) a[w] += double(xr[w]);
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
  detail::sum_rows(L, tail_out, 1, tail_runs * (inner_summed ? run : 1), acc_out.data(), add);
#pragma omp parallel for schedule(static) if (tail_out > kGrain)
  for (int64_t i = 0; i < tail_out; ++i) out[i] = T(acc_out[i]);
}

template <class T>
void bias_gelu_tanh(const T* x, const T* b, T* y, int64_t rows, int64_t C) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "bias_gelu_tanh rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;  // [C]
    T* yr = y + r * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = gelu_tanh_of(T(xr[c] + b[c]));
  }
}

template <class T>
void bias_gelu_tanh_backward(const T* dy, const T* x, const T* b, T* dx, int64_t rows, int64_t C) {
  AUTOSP_ASSERT(rows >= 0 && C > 0, "bias_gelu_tanh_backward rows ", rows, " C ", C);
#pragma omp parallel for schedule(static) if (rows * C > kGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T *xr = x + r * C, *dyr = dy + r * C;  // [C]
    T* dxr = dx + r * C;
    for (int64_t c = 0; c < C; ++c) dxr[c] = dyr[c] * gelu_tanh_grad(T(xr[c] + b[c]));
  }
}

template <class T>
double sum_squares(const T* x, int64_t n) {
  AUTOSP_ASSERT(n >= 0, "sum_squares n ", n);
  return chunked_sum(x, n, [](double v) { return v * v; });
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
    case Unary::gelu_tanh: return map(x, y, n, [](T v) { return gelu_tanh_of(v); });
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

template <class T>
void copy_strided(int rank, const int64_t* shape, const T* src, const int64_t* src_strides, T* dst) {
  const int64_t* strides[1] = {src_strides};
  const Space s = simplify(rank, shape, 1, strides);
  if (s.numel == 0) return;
  const int64_t inner_stride = s.stride[0][s.rank - 1];
  if (inner_stride != 0 && inner_stride != 1) {  // a dense dim further out means a transpose
    for (int p = s.rank - 2; p >= 0; --p)
      if (s.stride[0][p] == 1) return copy_tiled(s, p, src, dst);
  }
  for_each_run(s, 1, [&](int64_t o, const int64_t* off, int64_t n, const int64_t* st) {
    const T* from = src + off[0];
    T* to = dst + o;
    const int64_t step = st[0];
    if (step == 1) {
      std::memcpy(to, from, size_t(n) * sizeof(T));
    } else {
      for (int64_t i = 0; i < n; ++i) to[i] = from[i * step];
    }
  });
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

// ---- storage conversions -----------------------------------------------------------------------

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x0040u);  // NaN stays (quiet) NaN
  // Round to nearest even on the 16 dropped bits; a carry moves into the exponent (→ inf at the top).
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / NaN, payload kept
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal: rebias 15 → 127
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // ±0
    bits = sign;
  } else {  // subnormal mant · 2^-24: normalise around its leading bit p
    const int p = std::bit_width(mant) - 1;
    bits = sign | (uint32_t(p + 103) << 23) | ((mant ^ (1u << p)) << (23 - p));
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((x >> 13) & 0x3ffu));  // quiet NaN
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // inf, or ≥ 65520 which rounds to inf
  if (x >= 0x38800000u) {  // normal half (≥ 2^-14): rebias 127 → 15, round 23 → 10 mantissa bits
    uint32_t r = x - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return uint16_t(sign | (r >> 13));
  }
  const uint32_t e = x >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to ±0 (2^-25 itself ties to even 0 below)
  // Subnormal half: value / 2^-24 = mant · 2^(e - 126), rounded to nearest even.
  const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14 … 24
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;  // r may become 0x400, the smallest normal
  return uint16_t(sign | r);
}

uint16_t f64_to_bf16(double d) {
  if (std::isnan(d)) return f32_to_bf16(static_cast<float>(d));
  if (std::fabs(d) < 0x1p-126) {  // bf16 subnormals: multiples of 2^-133, the scaling is exact
    return f32_to_bf16(static_cast<float>(std::nearbyint(d * 0x1p133) * 0x1p-133));
  }
  // Keep 7 of the 52 fraction bits: round to nearest even on the 45 dropped ones (a carry moves
  // into the exponent). The result has 8 significant bits, so it is exact in f32 and in bf16.
  constexpr uint64_t kDrop = (uint64_t(1) << 45) - 1;
  uint64_t x = std::bit_cast<uint64_t>(d);
  x = (x + (kDrop >> 1) + ((x >> 45) & 1u)) & ~kDrop;
  const double r = std::bit_cast<double>(x);
  if (std::fabs(r) >= 0x1p128) return std::signbit(r) ? 0xff80u : 0x7f80u;  // ±inf
  return f32_to_bf16(static_cast<float>(r));
}

namespace {
template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<From, uint16_t>)
    return convert<To>(bf16_to_f32(v));
  else if constexpr (std::is_same_v<To, uint16_t> && std::is_same_v<From, double>)
    return f64_to_bf16(v);
  else if constexpr (std::is_same_v<To, uint16_t>)
    return f32_to_bf16(v);
  else
    return static_cast<To>(v);
}
}  // namespace

template <class From, class To>
void cast(const From* x, To* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = convert<To>(x[i]);
}

#define AUTOSP_INSTANTIATE_CAST(From)                                                                 \
  template void cast<From, float>(const From*, float*, int64_t);                                    \
  template void cast<From, double>(const From*, double*, int64_t);                                  \
  template void cast<From, uint16_t>(const From*, uint16_t*, int64_t);
AUTOSP_INSTANTIATE_CAST(float)
AUTOSP_INSTANTIATE_CAST(double)
AUTOSP_INSTANTIATE_CAST(uint16_t)
#undef AUTOSP_INSTANTIATE_CAST

#define AUTOSP_INSTANTIATE_FLOAT(T)                                                                   \
  template void unary<T>(Unary, const T*, T*, int64_t, double);                                     \
  template void binary<T>(Binary, int, const int64_t*, const T*, const int64_t*, const T*,          \
                          const int64_t*, T*);                                                      \
  template void unary_backward<T>(UnaryGrad, const T*, const T*, T*, int64_t);                      \
  template void bias_gelu_tanh<T>(const T*, const T*, T*, int64_t, int64_t);                        \
  template void bias_gelu_tanh_backward<T>(const T*, const T*, const T*, T*, int64_t, int64_t);     \
  template void sum_to<T>(const T*, int, const int64_t*, const int64_t*, T*);                       \
  template double sum_squares<T>(const T*, int64_t);
AUTOSP_INSTANTIATE_FLOAT(float)
AUTOSP_INSTANTIATE_FLOAT(double)
#undef AUTOSP_INSTANTIATE_FLOAT

#define AUTOSP_INSTANTIATE_COPY(T)                                                                    \
  template void copy_strided<T>(int, const int64_t*, const T*, const int64_t*, T*);                 \
  template void fill<T>(T*, int64_t, T);
AUTOSP_INSTANTIATE_COPY(float)
AUTOSP_INSTANTIATE_COPY(double)
AUTOSP_INSTANTIATE_COPY(int32_t)
AUTOSP_INSTANTIATE_COPY(int64_t)
AUTOSP_INSTANTIATE_COPY(uint16_t)
#undef AUTOSP_INSTANTIATE_COPY

}  // namespace autosp::cpu
