// Naive reference implementations for tests: the obvious loops, in double, over row-major data in
// std::vector<double> with explicit shapes. They must stay independent of src/ (no kernel code, no
// shared helpers), so a bug in a kernel cannot hide in its reference. Used by the kernel tests and
// by the graph-level op-case table.
//
// Notation: B = batch, N = query heads, Nkv = kv heads, S = sequence, D = head dim, C = channels,
// V = vocab. All tensors are contiguous row-major unless a signature says otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <stdexcept>
#include <vector>

namespace autosp::naive {

using Vec = std::vector<double>;
using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// n values drawn from N(0, stddev²) with a fixed seed (deterministic across runs and platforms
// that share libstdc++'s distributions).
inline Vec random_normal(int64_t n, uint32_t seed, double stddev = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  Vec x(size_t(n), 0.0);
  for (double& v : x) v = dist(gen);
  return x;
}

// n values drawn uniformly from [lo, hi) with a fixed seed.
inline Vec random_uniform(int64_t n, uint32_t seed, double lo, double hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec x(size_t(n), 0.0);
  for (double& v : x) v = dist(gen);
  return x;
}

// ---- matmul ------------------------------------------------------------------------------------

// One GEMM: returns alpha · op(A) · op(B) + beta · C, C [M, N]. op(A) is [M, K]: A is stored [M, K],
// or [K, M] when trans_a. op(B) is [K, N]: B is stored [K, N], or [N, K] when trans_b. beta == 0
// ignores C (which may then be empty).
inline Vec gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const Vec& a,
                const Vec& b, double beta, const Vec& c) {
  Vec out(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < K; ++p) {
        const double av = trans_a ? a[size_t(p * M + i)] : a[size_t(i * K + p)];
        const double bv = trans_b ? b[size_t(j * K + p)] : b[size_t(p * N + j)];
        sum += av * bv;
      }
      out[size_t(i * N + j)] = alpha * sum + (beta == 0 ? 0.0 : beta * c[size_t(i * N + j)]);
    }
  return out;
}

// The same with leading dimensions, for a case `g` with ta, tb, M, N, K, alpha and beta: C = alpha ·
// op(A) · op(B) + beta · C0 written into a copy of C0 (its padding kept); with `magnitude` the same
// over absolute values (the bound the tolerances scale by). beta = 0 ignores C0's values (they may
// be NaN).
template <class Case>
Vec strided_gemm(const Case& g, int64_t lda, int64_t ldb, int64_t ldc, const Vec& a, const Vec& b, const Vec& c0,
                 bool magnitude) {
  Vec c = c0;
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.N; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < g.K; ++k) {
        const double x = g.ta ? a[k * lda + i] : a[i * lda + k], y = g.tb ? b[j * ldb + k] : b[k * ldb + j];
        sum += magnitude ? std::abs(x * y) : x * y;
      }
      const double old = g.beta == 0 ? 0.0 : g.beta * c0[i * ldc + j];
      c[i * ldc + j] = magnitude ? std::abs(g.alpha) * sum + std::abs(old) : g.alpha * sum + old;
    }
  return c;
}

// ---- elementwise -------------------------------------------------------------------------------

inline double gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
// x rounded to bfloat16 (8 significant bits, f32's exponent range), ties to even, by scaling:
// the value in units of its bf16 spacing, rounded to an integer (nearbyint: ties to even).
inline double round_bf16(double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e;
  std::frexp(x, &e);                         // |x| = m·2^e, m in [0.5, 1)
  const int q = std::max(e, -125) - 8;       // spacing 2^q; below 2^-126 the subnormals share 2^-133
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);
  return std::fabs(r) >= std::ldexp(1.0, 128) ? std::copysign(INFINITY, x) : r;
}
inline double round_f32(double x) { return static_cast<double>(static_cast<float>(x)); }

inline double silu(double x) { return x / (1.0 + std::exp(-x)); }
inline double relu(double x) { return x > 0 ? x : 0.0; }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

// y[i] = f(x[i]).
// ---- dropout -------------------------------------------------------------------------------------
// The mask as kernels/kinds.h specifies it, written out from that spec (splitmix64's finaliser,
// Steele et al. 2014): element c of token t is kept when the top 32 bits of
// f(f(f(seed) ^ (t·φ + k)) + c·φ) are ≥ round(p·2^32); kept values are x / (1 − p).
inline uint64_t splitmix64_finalise(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}
inline bool dropout_kept(uint64_t seed, int64_t token, int64_t c, double p) {
  const uint64_t phi = 0x9E3779B97F4A7C15ull;
  const uint64_t row =
      splitmix64_finalise(splitmix64_finalise(seed) ^ (uint64_t(token) * phi + 0x632BE59BD9B4E019ull));
  const uint64_t bits = splitmix64_finalise(row + uint64_t(c) * phi) >> 32;
  return double(bits) >= std::round(p * 4294967296.0);
}
// x [rows, C], token [rows]
inline Vec dropout(const Vec& x, const std::vector<int64_t>& token, int64_t C, double p, uint64_t seed) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = dropout_kept(seed, token[i / size_t(C)], int64_t(i % size_t(C)), p) ? x[i] / (1 - p) : 0.0;
  return y;
}

inline Vec map(const Vec& x, const std::function<double(double)>& f) {
  Vec y(x.size(), 0.0);
  for (size_t i = 0; i < x.size(); ++i) y[i] = f(x[i]);
  return y;
}

// Derivatives of the activations above, from the tanh / sigmoid formulas.
inline double gelu_tanh_grad(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}
inline double silu_grad(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s + x * s * (1.0 - s);
}

// Sums x [x_shape] down to out_shape (same rank, each dim equal or 1): every element of x is added
// to the output element whose index clamps the summed dims to 0.
inline Vec sum_to(const Vec& x, const Shape& x_shape, const Shape& out_shape) {
  const size_t r = x_shape.size();
  Vec out(size_t(numel(out_shape)), 0.0);
  Shape idx(r, 0);
  for (size_t lin = 0; lin < x.size(); ++lin) {
    for (int64_t rem = int64_t(lin), d = int64_t(r) - 1; d >= 0; --d) {
      idx[size_t(d)] = rem % x_shape[size_t(d)];
      rem /= x_shape[size_t(d)];
    }
    int64_t off = 0;
    for (size_t d = 0; d < r; ++d) off = off * out_shape[d] + (out_shape[d] == 1 ? 0 : idx[d]);
    out[size_t(off)] += x[lin];
  }
  return out;
}

// NumPy broadcasting of two shapes (aligned at the right; a dim of 1 stretches). Throws
// std::invalid_argument when they do not broadcast.
inline Shape broadcast_shape(const Shape& a, const Shape& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) throw std::invalid_argument("shapes do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// out = f(a, b) with NumPy broadcasting; out has broadcast_shape(a_shape, b_shape).
inline Vec broadcast_binary(const Vec& a, const Shape& a_shape, const Vec& b, const Shape& b_shape,
                            const std::function<double(double, double)>& f) {
  const Shape out_shape = broadcast_shape(a_shape, b_shape);
  const size_t r = out_shape.size();
  Vec out(size_t(numel(out_shape)), 0.0);
  Shape idx(r, 0);
  for (size_t lin = 0; lin < out.size(); ++lin) {
    // idx = multi-index of lin in out_shape
    for (int64_t rem = int64_t(lin), d = int64_t(r) - 1; d >= 0; --d) {
      idx[size_t(d)] = rem % out_shape[size_t(d)];
      rem /= out_shape[size_t(d)];
    }
    auto offset = [&](const Shape& shape) {
      int64_t off = 0;
      for (size_t d = 0; d < shape.size(); ++d) {
        const int64_t i = shape[d] == 1 ? 0 : idx[d + (r - shape.size())];
        off = off * shape[d] + i;
      }
      return size_t(off);
    };
    out[lin] = f(a[offset(a_shape)], b[offset(b_shape)]);
  }
  return out;
}

// Permutes the dims of x [shape]: out dim d is input dim perm[d] (torch.permute).
inline Vec permute(const Vec& x, const Shape& shape, const std::vector<int>& perm) {
  const size_t r = shape.size();
  Shape out_shape(r), in_idx(r, 0);
  for (size_t d = 0; d < r; ++d) out_shape[d] = shape[size_t(perm[d])];
  Vec out(x.size(), 0.0);
  for (size_t lin = 0; lin < out.size(); ++lin) {
    for (int64_t rem = int64_t(lin), d = int64_t(r) - 1; d >= 0; --d) {
      in_idx[size_t(perm[size_t(d)])] = rem % out_shape[size_t(d)];
      rem /= out_shape[size_t(d)];
    }
    int64_t off = 0;
    for (size_t d = 0; d < r; ++d) off = off * shape[d] + in_idx[d];
    out[lin] = x[size_t(off)];
  }
  return out;
}

// ---- normalisation -----------------------------------------------------------------------------

// x [rows, C]; w, b [C] (b may be empty). mean, rstd [rows] are written when non-null.
inline Vec layernorm(const Vec& x, const Vec& w, const Vec& b, int64_t rows, int64_t C, double eps,
                     Vec* mean = nullptr, Vec* rstd = nullptr) {
  Vec y(x.size(), 0.0);
  if (mean) mean->assign(size_t(rows), 0.0);
  if (rstd) rstd->assign(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0;
    for (int64_t c = 0; c < C; ++c) mu += x[size_t(r * C + c)];
    mu /= double(C);
    double var = 0;
    for (int64_t c = 0; c < C; ++c) var += (x[size_t(r * C + c)] - mu) * (x[size_t(r * C + c)] - mu);
    var /= double(C);
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c)
      y[size_t(r * C + c)] =
          (x[size_t(r * C + c)] - mu) * rs * w[size_t(c)] + (b.empty() ? 0.0 : b[size_t(c)]);
    if (mean) (*mean)[size_t(r)] = mu;
    if (rstd) (*rstd)[size_t(r)] = rs;
  }
  return y;
}

// x [rows, C]; w [C]. y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps), written to rstd [rows].
inline Vec rmsnorm(const Vec& x, const Vec& w, int64_t rows, int64_t C, double eps,
                   Vec* rstd = nullptr) {
  Vec y(x.size(), 0.0);
  if (rstd) rstd->assign(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[size_t(r * C + c)] * x[size_t(r * C + c)];
    const double rs = 1.0 / std::sqrt(ms / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) y[size_t(r * C + c)] = x[size_t(r * C + c)] * rs * w[size_t(c)];
    if (rstd) (*rstd)[size_t(r)] = rs;
  }
  return y;
}

// Softmax over the last dim of x [rows, C].
inline Vec softmax(const Vec& x, int64_t rows, int64_t C) {
  Vec y(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, x[size_t(r * C + c)]);
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(x[size_t(r * C + c)] - mx);
    for (int64_t c = 0; c < C; ++c) y[size_t(r * C + c)] = std::exp(x[size_t(r * C + c)] - mx) / sum;
  }
  return y;
}

// Backward of the normalisations through their explicit Jacobians (dx_k = Σ_c dy_c ∂y_c/∂x_k,
// O(C²) per row), not through the simplified formulas the kernels use. x, dy [rows, C]; w [C].

// Layernorm: ∂y_c/∂x_k = w_c · rstd · (δ_ck - 1/C - xhat_c · xhat_k / C); dw = Σ_r dy · xhat,
// db = Σ_r dy. Outputs are resized.
inline void layernorm_backward(const Vec& dy, const Vec& x, const Vec& w, int64_t rows, int64_t C, double eps,
                               Vec& dx, Vec& dw, Vec& db) {
  dx.assign(x.size(), 0.0);
  dw.assign(size_t(C), 0.0);
  db.assign(size_t(C), 0.0);
  Vec xhat(static_cast<size_t>(C));
  for (int64_t r = 0; r < rows; ++r) {
    // The mean in long double: a plain double sum of C values with a large common offset shifts
    // every xhat by ~√C·ε·offset, which the Jacobian sums amplify past the 1e-12 tolerance.
    long double mu = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mu += x[size_t(r * C + c)];
    mu /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (x[size_t(r * C + c)] - mu) * (x[size_t(r * C + c)] - mu);
    const double rs = double(1.0L / std::sqrt(var / C + eps));
    for (int64_t c = 0; c < C; ++c) xhat[size_t(c)] = double((x[size_t(r * C + c)] - mu) * rs);
    for (int64_t k = 0; k < C; ++k) {
      double sum = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double jac = w[size_t(c)] * rs *
                           ((c == k ? 1.0 : 0.0) - 1.0 / double(C) - xhat[size_t(c)] * xhat[size_t(k)] / double(C));
        sum += dy[size_t(r * C + c)] * jac;
      }
      dx[size_t(r * C + k)] = sum;
    }
    for (int64_t c = 0; c < C; ++c) {
      dw[size_t(c)] += dy[size_t(r * C + c)] * xhat[size_t(c)];
      db[size_t(c)] += dy[size_t(r * C + c)];
    }
  }
}

// RMSNorm: ∂y_c/∂x_k = w_c · (rstd · δ_ck - x_c · x_k · rstd³ / C); dw = Σ_r dy · x · rstd.
inline void rmsnorm_backward(const Vec& dy, const Vec& x, const Vec& w, int64_t rows, int64_t C, double eps,
                             Vec& dx, Vec& dw) {
  dx.assign(x.size(), 0.0);
  dw.assign(size_t(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * C;
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += xr[c] * xr[c];
    const double rs = 1.0 / std::sqrt(ms / double(C) + eps);
    for (int64_t k = 0; k < C; ++k) {
      double sum = 0;
      for (int64_t c = 0; c < C; ++c)
        sum += dy[size_t(r * C + c)] * w[size_t(c)] *
               ((c == k ? rs : 0.0) - xr[c] * xr[k] * rs * rs * rs / double(C));
      dx[size_t(r * C + k)] = sum;
    }
    for (int64_t c = 0; c < C; ++c) dw[size_t(c)] += dy[size_t(r * C + c)] * xr[c] * rs;
  }
}

// Softmax with output y [rows, C]: ∂y_c/∂x_k = y_c · (δ_ck - y_k).
inline Vec softmax_backward(const Vec& dy, const Vec& y, int64_t rows, int64_t C) {
  Vec dx(y.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < C; ++k) {
      double sum = 0;
      for (int64_t c = 0; c < C; ++c)
        sum += dy[size_t(r * C + c)] * y[size_t(r * C + c)] * ((c == k ? 1.0 : 0.0) - y[size_t(r * C + k)]);
      dx[size_t(r * C + k)] = sum;
    }
  return dx;
}

// ---- attention ---------------------------------------------------------------------------------

// Materialises the full score matrix. q [B, N, Sq, D], k, v [B, Nkv, Skv, D] → o [B, N, Sq, D];
// query head h reads kv head h / (N / Nkv). Causal: query i sees keys j ≤ i + (Skv - Sq). A query
// that sees no key gets o = 0 and lse = -inf. lse [B, N, Sq] is written when non-null.
// Packed documents (`starts`, document starts [B, Sq], may be null): query i of batch b also sees
// key j only when j ≥ starts[b·Sq + i], tested per element.
inline bool sdpa_visible(bool causal, const std::vector<int64_t>* starts, int64_t b, int64_t i, int64_t j,
                         int64_t Sq, int64_t Skv) {
  if (causal && j > i + (Skv - Sq)) return false;
  return starts == nullptr || j >= (*starts)[size_t(b * Sq + i)];
}

inline Vec sdpa(const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t N, int64_t Nkv,
                int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, Vec* lse = nullptr,
                const std::vector<int64_t>* docs = nullptr) {
  Vec o(size_t(B * N * Sq * D), 0.0);
  if (lse) lse->assign(size_t(B * N * Sq), 0.0);
  const int64_t group = N / Nkv;
  Vec score(size_t(Sq * Skv), 0.0);  // [Sq, Skv]
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < N; ++h) {
      const int64_t hk = h / group;
      const double* qh = q.data() + (b * N + h) * Sq * D;
      const double* kh = k.data() + (b * Nkv + hk) * Skv * D;
      const double* vh = v.data() + (b * Nkv + hk) * Skv * D;
      double* oh = o.data() + (b * N + h) * Sq * D;
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t j = 0; j < Skv; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qh[i * D + d] * kh[j * D + d];
          const bool visible = sdpa_visible(causal, docs, b, i, j, Sq, Skv);
          score[size_t(i * Skv + j)] = visible ? dot * scale : -std::numeric_limits<double>::infinity();
        }
      for (int64_t i = 0; i < Sq; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Skv; ++j) mx = std::max(mx, score[size_t(i * Skv + j)]);
        double sum = 0;
        if (mx > -std::numeric_limits<double>::infinity())
          for (int64_t j = 0; j < Skv; ++j) sum += std::exp(score[size_t(i * Skv + j)] - mx);
        for (int64_t j = 0; j < Skv && sum > 0; ++j) {
          const double p = std::exp(score[size_t(i * Skv + j)] - mx) / sum;
          for (int64_t d = 0; d < D; ++d) oh[i * D + d] += p * vh[j * D + d];
        }
        if (lse)
          (*lse)[size_t((b * N + h) * Sq + i)] =
              sum > 0 ? mx + std::log(sum) : -std::numeric_limits<double>::infinity();
      }
    }
  return o;
}

// Backward of sdpa by the textbook formulas on the materialised probabilities, per head:
// P = softmax(scale · q·kᵀ) over the visible keys (a row that sees none is 0), dv = Pᵀ·dout,
// dP = dout·vᵀ, dS_ij = P_ij · (dP_ij - Σ_j' P_ij' · dP_ij'), dq = scale · dS·k, dk = scale · dSᵀ·q;
// dk, dv of a kv head sum over its query heads. Outputs are resized.
inline void sdpa_backward(const Vec& q, const Vec& k, const Vec& v, const Vec& dout, int64_t B, int64_t N,
                          int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, Vec& dq,
                          Vec& dk, Vec& dv, const std::vector<int64_t>* docs = nullptr) {
  dq.assign(size_t(B * N * Sq * D), 0.0);
  dk.assign(size_t(B * Nkv * Skv * D), 0.0);
  dv.assign(size_t(B * Nkv * Skv * D), 0.0);
  const int64_t group = N / Nkv;
  Vec P(size_t(Sq * Skv)), dS(size_t(Sq * Skv));  // [Sq, Skv]
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < N; ++h) {
      const int64_t hk = h / group;
      const size_t qo = size_t((b * N + h) * Sq * D), ko = size_t((b * Nkv + hk) * Skv * D);
      for (int64_t i = 0; i < Sq; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Skv; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[qo + size_t(i * D + d)] * k[ko + size_t(j * D + d)];
          const bool visible = sdpa_visible(causal, docs, b, i, j, Sq, Skv);
          P[size_t(i * Skv + j)] = visible ? dot * scale : -std::numeric_limits<double>::infinity();
          mx = std::max(mx, P[size_t(i * Skv + j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < Skv; ++j) {
          const double e = mx == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(P[size_t(i * Skv + j)] - mx);
          P[size_t(i * Skv + j)] = e;
          sum += e;
        }
        for (int64_t j = 0; j < Skv; ++j) P[size_t(i * Skv + j)] = sum > 0 ? P[size_t(i * Skv + j)] / sum : 0.0;
        double rowdot = 0;  // Σ_j P_ij · dP_ij
        for (int64_t j = 0; j < Skv; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += dout[qo + size_t(i * D + d)] * v[ko + size_t(j * D + d)];
          dS[size_t(i * Skv + j)] = dp;
          rowdot += P[size_t(i * Skv + j)] * dp;
        }
        for (int64_t j = 0; j < Skv; ++j)
          dS[size_t(i * Skv + j)] = P[size_t(i * Skv + j)] * (dS[size_t(i * Skv + j)] - rowdot);
      }
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t j = 0; j < Skv; ++j)
          for (int64_t d = 0; d < D; ++d) {
            const double p = P[size_t(i * Skv + j)], ds = dS[size_t(i * Skv + j)];
            dv[ko + size_t(j * D + d)] += p * dout[qo + size_t(i * D + d)];
            dq[qo + size_t(i * D + d)] += scale * ds * k[ko + size_t(j * D + d)];
            dk[ko + size_t(j * D + d)] += scale * ds * q[qo + size_t(i * D + d)];
          }
    }
}

// ---- rope --------------------------------------------------------------------------------------

// Rotate-half RoPE in double. x [B, N, S, D], position_ids [B, S]:
// y[.., i] = x[i]·cos(a_i) - x[i + D/2]·sin(a_i), y[.., i + D/2] = x[i + D/2]·cos(a_i) + x[i]·sin(a_i)
// with a_i = pos · theta^(-2i/D), i < D/2.
inline Vec rope_freqs(const Vec& x, const std::vector<int64_t>& position_ids, int64_t B, int64_t N, int64_t S,
                      int64_t D, const Vec& inv_freq, double attention);
inline Vec rope(const Vec& x, const std::vector<int64_t>& position_ids, int64_t B, int64_t N,
                int64_t S, int64_t D, double theta) {
  Vec inv_freq(size_t(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) inv_freq[size_t(i)] = 1.0 / std::pow(theta, double(2 * i) / double(D));
  return rope_freqs(x, position_ids, B, N, S, D, inv_freq, 1.0);
}

// Backward of rope: the transpose of each 2×2 rotation [[cos, -sin], [sin, cos]] applied to the
// pair (dy[i], dy[i + D/2]).
inline Vec rope_backward(const Vec& dy, const std::vector<int64_t>& position_ids, int64_t B, int64_t N,
                         int64_t S, int64_t D, double theta) {
  Vec dx(dy.size(), 0.0);
  const int64_t H = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const double pos = double(position_ids[size_t(b * S + s)]);
        const size_t row = size_t(((b * N + n) * S + s) * D);
        for (int64_t i = 0; i < H; ++i) {
          const double a = pos / std::pow(theta, double(2 * i) / double(D));
          const double rot[2][2] = {{std::cos(a), -std::sin(a)}, {std::sin(a), std::cos(a)}};
          const double g[2] = {dy[row + size_t(i)], dy[row + size_t(i + H)]};
          dx[row + size_t(i)] = rot[0][0] * g[0] + rot[1][0] * g[1];
          dx[row + size_t(i + H)] = rot[0][1] * g[0] + rot[1][1] * g[1];
        }
      }
  return dx;
}

// YaRN's inverse frequencies and attention factor (transformers 5's _compute_yarn_parameters,
// transcribed to double): correction dims d(r) = D·ln(orig / (2π·r)) / (2·ln theta) for
// r = beta_fast, beta_slow, floored/ceiled when `truncate`, clamped to [0, D - 1]; the ramp
// m_i = clamp((i - low) / (high - low), 0, 1); inv_freq = f_i / factor · m_i + f_i · (1 - m_i).
inline Vec yarn_inv_freq(int64_t D, double theta, double factor, double orig, double beta_fast, double beta_slow,
                         bool truncate) {
  auto dim_of = [&](double r) { return double(D) * std::log(orig / (r * 2 * M_PI)) / (2 * std::log(theta)); };
  double low = dim_of(beta_fast), high = dim_of(beta_slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, double(D - 1));
  if (low == high) high += 0.001;
  Vec out;
  for (int64_t i = 0; i < D / 2; ++i) {
    const double f = 1.0 / std::pow(theta, double(2 * i) / double(D));
    const double m = std::min(1.0, std::max(0.0, (double(i) - low) / (high - low)));
    out.push_back(f / factor * m + f * (1 - m));
  }
  return out;
}
// mscale(s, m) = 0.1·m·ln(s) + 1 (1 for s <= 1); the factor is mscale(factor, mscale) /
// mscale(factor, mscale_all_dim) when both are nonzero, else mscale(factor, 1).
inline double yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  auto ms = [&](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  return mscale != 0 && mscale_all_dim != 0 ? ms(mscale) / ms(mscale_all_dim) : ms(1.0);
}
// Rotate-half RoPE with the given inv_freq [D/2], cos and sin multiplied by `attention`.
inline Vec rope_freqs(const Vec& x, const std::vector<int64_t>& position_ids, int64_t B, int64_t N, int64_t S,
                      int64_t D, const Vec& inv_freq, double attention) {
  Vec y(x.size(), 0.0);
  const int64_t H = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const double pos = double(position_ids[size_t(b * S + s)]);
        const size_t row = size_t(((b * N + n) * S + s) * D);
        for (int64_t i = 0; i < H; ++i) {
          const double a = pos * inv_freq[size_t(i)], c = attention * std::cos(a), sn = attention * std::sin(a);
          const double x1 = x[row + size_t(i)], x2 = x[row + size_t(i + H)];
          y[row + size_t(i)] = x1 * c - x2 * sn;
          y[row + size_t(i + H)] = x2 * c + x1 * sn;
        }
      }
  return y;
}

// ---- loss and embedding ------------------------------------------------------------------------

// Σ over rows whose label is not ignore_index of (log Σ_j exp(logits[r, j]) - logits[r, label]).
// logits [rows, V]. Labels must be valid (the reference does not check).
inline double cross_entropy(const Vec& logits, const std::vector<int64_t>& labels, int64_t rows,
                            int64_t V, int64_t ignore_index = -100) {
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (labels[size_t(r)] == ignore_index) continue;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, logits[size_t(r * V + j)]);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(logits[size_t(r * V + j)] - mx);
    total += mx + std::log(sum) - logits[size_t(r * V + labels[size_t(r)])];
  }
  return total;
}

// Preference training, written out from the definitions: out [B, 2, K] = Σ log softmax(logits[b, t])
// at labels[b, t] over the targets with slot +(k + 1) (side 0) or −(k + 1) (side 1).
inline Vec sequence_logps(const Vec& logits, const std::vector<int64_t>& labels, const std::vector<int64_t>& slots,
                          int64_t B, int64_t S, int64_t V, int64_t K) {
  Vec out(size_t(B * 2 * K), 0.0);
  for (int64_t r = 0; r < B * S; ++r) {
    const int64_t s = slots[size_t(r)];
    if (labels[size_t(r)] == -100 || s == 0) continue;
    const Vec row(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    out[size_t(((r / S) * 2 + (s > 0 ? 0 : 1)) * K + std::abs(s) - 1)] -=
        cross_entropy(row, {labels[size_t(r)]}, 1, V);
  }
  return out;
}

struct Dpo {
  double beta;
  bool ipo;
  double label_smoothing, rpo_alpha;
};
// TRL's DPO loss over policy [B, 2, K] with a constant reference and completion length `tokens`,
// normalised by norms = (pairs, chosen tokens).
inline double dpo_loss(const Vec& policy, double ref, double tokens, std::pair<double, double> norms, const Dpo& d) {
  const size_t K = 3, pairs = policy.size() / 2;
  double loss = 0, chosen = 0;
  for (size_t p = 0; p < pairs; ++p) {
    const double pc = policy[(p / K) * 2 * K + p % K], pr = policy[(p / K) * 2 * K + K + p % K];
    const double avg = d.ipo ? tokens : 1;
    const double z = (pc / avg - pr / avg) - (ref / avg - ref / avg);
    auto logsig = [](double x) { return -std::log(1 + std::exp(-x)); };
    loss += d.ipo ? std::pow(z - 1 / (2 * d.beta), 2)
                  : -(1 - d.label_smoothing) * logsig(d.beta * z) - d.label_smoothing * logsig(-d.beta * z);
    chosen += pc;
  }
  return loss / norms.first + d.rpo_alpha * -chosen / norms.second;
}

// weight [V, C], ids [n] → out [n, C]. Ids must be valid (the reference does not check).
inline Vec embedding(const Vec& weight, const std::vector<int64_t>& ids, int64_t C) {
  Vec out(ids.size() * size_t(C), 0.0);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < C; ++c) out[i * size_t(C) + size_t(c)] = weight[size_t(ids[i] * C + c)];
  return out;
}

// dlogits = grad · (softmax(logits[r]) - onehot(label[r])) for labelled rows, 0 for ignored ones.
inline Vec cross_entropy_backward(const Vec& logits, const std::vector<int64_t>& labels, int64_t rows, int64_t V,
                                  double grad, int64_t ignore_index = -100) {
  Vec d(logits.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (labels[size_t(r)] == ignore_index) continue;
    const Vec p = softmax(Vec(logits.begin() + r * V, logits.begin() + (r + 1) * V), 1, V);
    for (int64_t j = 0; j < V; ++j)
      d[size_t(r * V + j)] = grad * (p[size_t(j)] - (j == labels[size_t(r)] ? 1.0 : 0.0));
  }
  return d;
}

// dweight [V, C] = Σ over positions i of dy[i, :] added to row ids[i].
inline Vec embedding_backward(const Vec& dy, const std::vector<int64_t>& ids, int64_t V, int64_t C) {
  Vec dw(size_t(V * C), 0.0);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < C; ++c) dw[size_t(ids[i] * C + c)] += dy[i * size_t(C) + size_t(c)];
  return dw;
}

// ---- SwiGLU MLP (Hugging Face LlamaMLP: gate_proj, up_proj, down_proj, no biases) -------------

// x [R, C], wg, wu [I, C], wd [C, I]: y [R, C] = (silu(x·wgᵀ) ∘ (x·wuᵀ))·wdᵀ, one row at a time.
inline Vec swiglu_mlp(const Vec& x, const Vec& wg, const Vec& wu, const Vec& wd, int64_t R, int64_t C, int64_t I) {
  Vec y(size_t(R * C), 0.0), h(static_cast<size_t>(I), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < C; ++c) {
        g += x[r * C + c] * wg[i * C + c];
        u += x[r * C + c] * wu[i * C + c];
      }
      h[i] = silu(g) * u;
    }
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < I; ++i) y[r * C + c] += h[i] * wd[c * I + i];
  }
  return y;
}

// Its gradients for the output gradient dy [R, C], by the chain rule one row at a time:
// dh_i = Σ_c dy_c·wd[c, i]; dg_i = dh_i·u_i·silu'(g_i); du_i = dh_i·silu(g_i);
// dx_c = Σ_i dg_i·wg[i, c] + du_i·wu[i, c]; dwg[i, c] = Σ_r dg_i·x_c, dwu likewise; dwd[c, i] = Σ_r dy_c·h_i.
inline void swiglu_mlp_backward(const Vec& dy, const Vec& x, const Vec& wg, const Vec& wu, const Vec& wd, int64_t R,
                                int64_t C, int64_t I, Vec& dx, Vec& dwg, Vec& dwu, Vec& dwd) {
  dx.assign(size_t(R * C), 0.0);
  dwg.assign(size_t(I * C), 0.0);
  dwu.assign(size_t(I * C), 0.0);
  dwd.assign(size_t(C * I), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0, dh = 0;
      for (int64_t c = 0; c < C; ++c) {
        g += x[r * C + c] * wg[i * C + c];
        u += x[r * C + c] * wu[i * C + c];
        dh += dy[r * C + c] * wd[c * I + i];
      }
      const double dg = dh * u * silu_grad(g), du = dh * silu(g);
      for (int64_t c = 0; c < C; ++c) {
        dx[r * C + c] += dg * wg[i * C + c] + du * wu[i * C + c];
        dwg[i * C + c] += dg * x[r * C + c];
        dwu[i * C + c] += du * x[r * C + c];
        dwd[c * I + i] += dy[r * C + c] * silu(g) * u;
      }
    }
  }
}

// ---- mixture-of-experts experts (transformers' MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock) ---

// Row r's k largest probabilities of probs [R, E], largest first (ties: lower index).
inline std::vector<int64_t> topk_experts(const Vec& probs, int64_t r, int64_t E, int64_t k) {
  std::vector<bool> taken(size_t(E), false);
  std::vector<int64_t> chosen;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)
      if (!taken[e] && (best < 0 || probs[r * E + e] > probs[r * E + best])) best = e;
    taken[best] = true;
    chosen.push_back(best);
  }
  return chosen;
}

// x [R, C], probs [R, E], wg, wu [E, I, C], wd [E, C, I]: one token at a time, its k largest
// probabilities (topk_experts), weights renormalised over them when `norm`, and
// y[r] = Σ weight · swiglu_mlp of expert e on x[r].
inline Vec moe_experts(const Vec& x, const Vec& probs, const Vec& wg, const Vec& wu, const Vec& wd, int64_t R,
                       int64_t C, int64_t E, int64_t I, int64_t k, bool norm) {
  Vec y(size_t(R * C), 0.0);
  auto slice = [](const Vec& v, int64_t at, int64_t n) { return Vec(v.begin() + at, v.begin() + at + n); };
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<int64_t> chosen = topk_experts(probs, r, E, k);
    double sum = 0;
    for (int64_t e : chosen) sum += probs[r * E + e];
    const Vec xr = slice(x, r * C, C);
    for (int64_t e : chosen) {
      const double w = norm ? probs[r * E + e] / sum : probs[r * E + e];
      const Vec ye = swiglu_mlp(xr, slice(wg, e * I * C, I * C), slice(wu, e * I * C, I * C), slice(wd, e * C * I, C * I),
                                1, C, I);
      for (int64_t c = 0; c < C; ++c) y[r * C + c] += w * ye[c];
    }
  }
  return y;
}

// gpt-oss's experts (tests/ref/gpt_oss_ref.py `expert`, `experts`): as moe_experts, each expert
// with biases bg, bu [E, I], bd [E, C] and the clamped SwiGLU: g = Wg·x + bg, u = Wu·x + bu,
// out = Wd·((clamp(u, −limit, limit) + 1)·min(g, limit)·σ(alpha·min(g, limit))) + bd.
inline Vec gpt_oss_experts(const Vec& x, const Vec& probs, const Vec& wg, const Vec& wu, const Vec& wd, const Vec& bg,
                           const Vec& bu, const Vec& bd, int64_t R, int64_t C, int64_t E, int64_t I, int64_t k,
                           bool norm, double alpha, double limit) {
  Vec y(size_t(R * C), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<int64_t> chosen = topk_experts(probs, r, E, k);
    double sum = 0;
    for (int64_t e : chosen) sum += probs[r * E + e];
    for (int64_t e : chosen) {
      const double w = norm ? probs[r * E + e] / sum : probs[r * E + e];
      Vec h(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = bg[e * I + i], u = bu[e * I + i];
        for (int64_t c = 0; c < C; ++c) {
          g += wg[(e * I + i) * C + c] * x[r * C + c];
          u += wu[(e * I + i) * C + c] * x[r * C + c];
        }
        g = std::min(g, limit), u = std::max(-limit, std::min(u, limit));
        h[i] = (u + 1) * g / (1 + std::exp(-alpha * g));
      }
      for (int64_t c = 0; c < C; ++c) {
        double out = bd[e * C + c];
        for (int64_t i = 0; i < I; ++i) out += wd[(e * C + c) * I + i] * h[i];
        y[r * C + c] += w * out;
      }
    }
  }
  return y;
}

// The router statistics [2, E] of probs [R, E]: each expert's top-k row count, its summed probability.
inline Vec moe_router_stats(const Vec& probs, int64_t R, int64_t E, int64_t k) {
  Vec y(size_t(2 * E), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t e : topk_experts(probs, r, E, k)) y[e] += 1;
    for (int64_t e = 0; e < E; ++e) y[E + e] += probs[r * E + e];
  }
  return y;
}

// transformers 4.44's load_balancing_loss_func without an attention mask, as written there: the
// layers' probabilities [L·R, E] concatenated, tokens_per_expert [k, E] = mean over rows of the
// top-k one-hots, router_prob_per_expert [E] = mean over rows, E · Σ tokens_per_expert · router_prob.
inline double load_balancing_loss(const std::vector<Vec>& layer_probs, int64_t R, int64_t E, int64_t k) {
  Vec tokens(size_t(k * E), 0.0), prob(size_t(E), 0.0);
  const double N = double(R) * double(layer_probs.size());
  for (const Vec& p : layer_probs)
    for (int64_t r = 0; r < R; ++r) {
      const std::vector<int64_t> chosen = topk_experts(p, r, E, k);
      for (int64_t j = 0; j < k; ++j) tokens[j * E + chosen[j]] += 1 / N;
      for (int64_t e = 0; e < E; ++e) prob[e] += p[r * E + e] / N;
    }
  double loss = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t e = 0; e < E; ++e) loss += tokens[j * E + e] * prob[e];
  return loss * double(E);
}

// ---- optimizer ---------------------------------------------------------------------------------

// One AdamW step as written in the torch.optim.AdamW documentation (amsgrad = false, t from 1):
//   θ ← θ - γλθ;  m ← β1·m + (1-β1)·g;  v ← β2·v + (1-β2)·g²;
//   m̂ = m / (1-β1^t);  v̂ = v / (1-β2^t);  θ ← θ - γ·m̂ / (√v̂ + ε)
inline void adamw_step(Vec& p, const Vec& g, Vec& m, Vec& v, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int64_t t) {
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] -= lr * weight_decay * p[i];
    m[i] = beta1 * m[i] + (1 - beta1) * g[i];
    v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
    const double m_hat = m[i] / (1 - std::pow(beta1, double(t)));
    const double v_hat = v[i] / (1 - std::pow(beta2, double(t)));
    p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
}

}  // namespace autosp::naive
