// CPU scaled-dot-product attention, flash-style (FlashAttention-2's loop order). Knows nothing of
// graphs.
//
// Tiles: a block of queries meets a block of keys (128 × 512 forward, 64 × 256 backward). The
// tile products (Q·Kᵀ, P·V and the backward's three more) run single-threaded inside the OpenMP
// region: f32 on an AVX-512 machine through our register-tiled micro-kernel (gemm_avx512; the key
// block of Kᵀ or Vᵀ is transposed per tile into a per-thread panel), otherwise through OpenBLAS,
// whose OpenMP build runs a call made inside a parallel region in the calling thread
// (num_cpu_avail() is 1 when omp_in_parallel()), so no GEMM is threaded twice. bf16 q, k, v run
// the same bodies with their products on vdpbf16ps (Bf16Tiles, attention_bf16.inc.h). The work
// between the GEMMs (row max, exp, row sums; the backward's P = exp(scale·s - lse) and dS = P ∘ (dP - Δ)) runs over tile
// rows in vector helpers: a polynomial exp for f32 (Cephes' expf, ~1 ulp), compiled per ISA with
// GCC's target_clones (AVX-512, AVX2, the baseline) and picked at load time, so the build stays
// x86-64-v2. f64 keeps std::exp (it is the gradient-check dtype, not a speed path).
//
// Small head dims (f32 on AVX-512; decisions 230, 231, 254, 255, 271), where a product with D
// columns is one or two vectors wide and pays a broadcast per FMA: the forward (D ≤ 32) runs
// transposed tiles, keys × queries (forward_small_d: Sᵀ = K·Qᵀ, whose register tiles give the
// column maxima where the tile hides no key, a column-wise online softmax, Oᵀ += Vᵀ·Pᵀ); the
// backward (D < 32) accumulates a task's dK, dV transposed ([D, keys], from dOᵀ·P and Qᵀ·dS). The
// f32 backward at any D writes P and dS straight from the score products' register tiles
// (gemm_epi), masked in the tiles with hidden keys. Every tile is 64-byte aligned (AlignedTile).
// The exps of both run as 2^y with log2 e folded into the scale (exp2_avx512, within ~1 ulp of
// exp16); the products' bits are those of the row form.
//
// Causal masking: key blocks past a query block's last visible key are never visited; a key block
// that reaches past the keys every row of the query block sees is cut there (whole_cut), and only
// the tiles on the diagonal apply a per-row limit, and their GEMMs run in strips of kStrip rows (or
// keys) that stop at the strip's own limit, so the products above the diagonal are mostly
// skipped. A query row that sees no key at all (causal with Sq > Skv, or Skv == 0) gets o = 0,
// lse = -inf, and adds nothing in the backward (dq = 0).
// Document masking (doc_start) works the same way from the other side: key blocks before the
// earliest document start of a query block are never visited, and a tile that holds a start
// keeps each row to the keys [start - j0, limit).
//
// Forward: parallel over (b, head, query block), late query blocks (most keys) first. Per query
// block, keys are visited in blocks with an online softmax: per row a running max m and sum l
// (double across blocks); when a block raises the max, the row's sum and output accumulator are
// rescaled by exp(m_old - m_new). Per-thread scratch: one score tile [BQ, BK], one accumulator
// [BQ, D], m, l [BQ]; no Sq×Skv matrix exists.
//
// Backward (FlashAttention-2 from the saved lse; 5 tile GEMMs, nothing recomputed twice): per
// (query block, key block) tile,
//   P = exp(scale · Q·Kᵀ - lse),  dP = dO·Vᵀ,  dS = P ∘ (dP - Δ)    (Δ_i = Σ_d dO_i · O_i, in double)
//   dV += Pᵀ·dO,  dK += scale · dSᵀ·Q,  dQ += scale · dS·K.
// Parallel over (b, kv head, query chunk): a task owns the dQ rows of its chunk (for every query
// head of its GQA group) and a dK, dV for its chunk: the last chunk (it sees every key) writes
// dk, dv directly, each earlier one a private copy of the keys it sees, added to dk, dv in chunk
// order afterwards. The number of chunks depends only on the sizes (enough tasks for a machine's
// threads when B·Nkv is small, 1 when it is large), so the summation order, and every bit of the
// result, is the same for any thread count, without atomics. Scratch: two [BQ, BK] tiles and a
// [D, BK] panel per thread (f32 on AVX-512: also the task's keys and values transposed, [D, keys]
// each, where both fit 1 MiB) and, with several chunks, the earlier chunks' dK, dV: under causal
// masking with C chunks about (C - 1)/2 copies of dk and dv (0.5 at C = 2), in a workspace whose
// size depends on the sizes only (sdpa_backward_workspace), which the memory plan places.
#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numbers>
#include <type_traits>
#include <vector>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/dp16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec16.h"
#include "tensor/check.h"
#include "tensor/convert.h"

namespace autosp::cpu {

namespace {

// Queries × keys per tile, measured on this 2-core AVX-512 machine (docs/performance.md): the
// forward gains ~1.3× at D = 16 from 512 keys over 256; the backward, with two tiles live, keeps 64 × 256.
constexpr int64_t kForwardBlockQ = 128, kForwardBlockK = 512;
constexpr int64_t kBackwardBlockQ = 64, kBackwardBlockK = 256;
// Row stride of the score tiles and key panels: BK + 16 floats, so that tile rows 2 KiB (or 1 KiB)
// apart do not all fall into the same few L1 sets when the micro-kernel reads 12 of them at once.
constexpr int64_t kTilePad = 16;
constexpr int64_t kMinTasks = 8;     // backward: chunks per (b, kv head) until there are this many tasks (decision 86)
constexpr int64_t kMaxChunks = 8;
// The backward's task panels (WideTiles::task_panels): at most this many floats per thread (1 MiB,
// so that they stay in L2; at S = 16k, D = 16 the 2 MiB panels ran no faster than per-tile
// transposes, decision 272).
constexpr int64_t kTaskPanelFloats = int64_t(1) << 18;

// A tile the causal diagonal crosses is cut into strips of kStrip rows (or keys), and each strip's
// GEMMs stop at its own limit: rows see more keys the later they are, so strip [r0, r1) needs the
// keys [0, limit(r1 - 1)) only, and keys [c0, c1) are seen by rows from the first whose limit
// passes c0. Without it the diagonal tile of a short sequence computed up to twice the products it
// kept (S = 256: 1.49× in the forward's 128-row blocks, 1.25× in the backward's 64-row ones). A
// multiple of 6 and 8, the micro-kernel's row counts.
constexpr int64_t kStrip = 24;

// A per-thread tile of n elements whose start is 64-byte aligned, so that each 16-float vector of a
// row (the row strides are multiples of 16 floats) is one cache line, not two: a vector's first
// element is only 16-byte aligned, and a tile read across line splits ran ~25% slower (D = 16).
template <class T>
class AlignedTile {
 public:
  explicit AlignedTile(int64_t n = 0) { resize(n); }
  void resize(int64_t n) {
    buf_.assign(size_t(n) + 64 / sizeof(T), T(0));
    data_ = buf_.data() + (64 - reinterpret_cast<uintptr_t>(buf_.data()) % 64) % 64 / sizeof(T);
  }
  T* data() { return data_; }
  T& operator[](int64_t i) { return data_[i]; }

 private:
  std::vector<T> buf_;
  T* data_ = nullptr;
};

// ---- vector helpers over one tile row (f32: one clone per ISA; f64: plain loops) ----
//
// The f32 helpers are written with GCC vector extensions over 16 lanes, which each clone lowers to
// its ISA (one zmm register, two ymm, four xmm); a row's last n % 16 entries go through the same
// code in a padded vector. (Plain loops do not vectorise here: GCC keeps a max reduction scalar
// without -ffinite-math-only.)

// f32x16, splat, load, store, their partial forms and exp16 come from vec16.h (always inlined, so the
// vectors never cross a call).
using vec16::exp16;
using vec16::f32x16;
using vec16::load;
using vec16::load_part;
using vec16::splat;
using vec16::store;
using vec16::store_part;
using vec16::vmin;

[[gnu::always_inline]] inline f32x16 vmax(f32x16 a, f32x16 b) { return a > b ? a : b; }
[[gnu::always_inline]] inline vec16::i32x16 load_i32(const int32_t* p) {
  vec16::i32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline float hmax(f32x16 v) {
  float m = v[0];
  for (int l = 1; l < 16; ++l) m = std::max(m, v[l]);
  return m;
}
[[gnu::always_inline]] inline float hmin(f32x16 v) {
  float m = v[0];
  for (int l = 1; l < 16; ++l) m = std::min(m, v[l]);
  return m;
}
[[gnu::always_inline]] inline float hsum(f32x16 v) {
  float s = 0;
  for (int l = 0; l < 16; ++l) s += v[l];
  return s;
}

// max_j (scale · s[j]) over j < n (-inf for n = 0), from one read of the row.
AUTOSP_VEC16_CLONES float max_scaled(const float* s, int64_t n, float scale) {
  const float inf = std::numeric_limits<float>::infinity();
  f32x16 hi = splat(-inf), lo = splat(inf);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const f32x16 x = load(s + j);
    hi = vmax(hi, x), lo = vmin(lo, x);
  }
  if (j < n) hi = vmax(hi, load_part(s + j, n - j, -inf)), lo = vmin(lo, load_part(s + j, n - j, inf));
  return n == 0 ? -inf : scale >= 0 ? scale * hmax(hi) : scale * hmin(lo);
}
double max_scaled(const double* s, int64_t n, double scale) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, scale * s[j]);
  return m;
}

// s[j] = exp(scale · s[j] - m) for j < n; returns Σ_j s[j].
AUTOSP_VEC16_CLONES float exp_sum(float* s, int64_t n, float scale, float m) {
  f32x16 sum = splat(0.0f);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const f32x16 p = exp16(load(s + j) * scale - m);
    store(s + j, p);
    sum += p;
  }
  if (j < n) {
    const f32x16 p = exp16(load_part(s + j, n - j, 0.0f) * scale - m);
    store_part(s + j, p, n - j);
    for (int64_t l = 0; l < n - j; ++l) sum[l] += p[l];
  }
  return hsum(sum);
}
double exp_sum(double* s, int64_t n, double scale, double m) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(scale * s[j] - m));
  return sum;
}

// The backward's row of P and dS: p[j] = exp(scale · p[j] - lse), ds[j] = p[j] · (ds[j] - delta)
// for j < n; both 0 for n ≤ j < width.
AUTOSP_VEC16_CLONES void probs_and_ds(float* p, float* ds, int64_t n, int64_t width, float scale, float lse, float delta) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const f32x16 pj = exp16(load(p + j) * scale - lse);
    store(p + j, pj);
    store(ds + j, pj * (load(ds + j) - delta));
  }
  if (j < n) {
    const f32x16 pj = exp16(load_part(p + j, n - j, 0.0f) * scale - lse);
    store_part(p + j, pj, n - j);
    store_part(ds + j, pj * (load_part(ds + j, n - j, 0.0f) - delta), n - j);
  }
  std::fill(p + n, p + width, 0.0f);
  std::fill(ds + n, ds + width, 0.0f);
}
void probs_and_ds(double* p, double* ds, int64_t n, int64_t width, double scale, double lse, double delta) {
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] * scale - lse);
    ds[j] = p[j] * (ds[j] - delta);
  }
  std::fill(p + n, p + width, 0.0);
  std::fill(ds + n, ds + width, 0.0);
}

// Softcap (kernels/attention_variant.h): s[j] = cap · tanh(scale · s[j] / cap) for j < n, with
// tanh(y) = sign(y) · (1 - 2 / (e^(2|y|) + 1)) on exp16 (absolute error ~1e-7 in tanh).
[[gnu::always_inline]] inline f32x16 tanh16(f32x16 y) {
  const f32x16 a = y < 0 ? -y : y;
  const f32x16 t = 1.0f - 2.0f / (exp16(a + a) + 1.0f);
  return y < 0 ? -t : t;
}
AUTOSP_VEC16_CLONES void softcap_row(float* s, int64_t n, float scale, float cap) {
  const float k = scale / cap;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) store(s + j, tanh16(load(s + j) * k) * cap);
  if (j < n) store_part(s + j, tanh16(load_part(s + j, n - j, 0.0f) * k) * cap, n - j);
}
void softcap_row(double* s, int64_t n, double scale, double cap) {
  for (int64_t j = 0; j < n; ++j) s[j] = cap * std::tanh(scale * s[j] / cap);
}

// probs_and_ds under a softcap: with t = tanh(scale · p[j] / cap), p[j] = exp(cap · t - lse) and
// ds[j] = p[j] · (ds[j] - delta) · (1 - t²) (the cap's derivative; the caller's dq, dk GEMMs apply
// the scale); both 0 for n ≤ j < width.
AUTOSP_VEC16_CLONES void capped_probs_and_ds(float* p, float* ds, int64_t n, int64_t width, float scale, float cap,
                                             float lse, float delta) {
  const float k = scale / cap;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const f32x16 t = tanh16(load(p + j) * k), pj = exp16(t * cap - lse);
    store(p + j, pj);
    store(ds + j, pj * (load(ds + j) - delta) * (1.0f - t * t));
  }
  if (j < n) {
    const f32x16 t = tanh16(load_part(p + j, n - j, 0.0f) * k), pj = exp16(t * cap - lse);
    store_part(p + j, pj, n - j);
    store_part(ds + j, pj * (load_part(ds + j, n - j, 0.0f) - delta) * (1.0f - t * t), n - j);
  }
  std::fill(p + n, p + width, 0.0f);
  std::fill(ds + n, ds + width, 0.0f);
}
void capped_probs_and_ds(double* p, double* ds, int64_t n, int64_t width, double scale, double cap, double lse,
                         double delta) {
  for (int64_t j = 0; j < n; ++j) {
    const double t = std::tanh(scale * p[j] / cap);
    p[j] = std::exp(cap * t - lse);
    ds[j] = p[j] * (ds[j] - delta) * (1 - t * t);
  }
  std::fill(p + n, p + width, 0.0);
  std::fill(ds + n, ds + width, 0.0);
}

// ---- tile GEMMs ----
//
// f32 on a machine with AVX-512: our own register-tiled micro-kernel (below), which reads B
// row-major and A through any strides, so Pᵀ and dSᵀ need no copy; the key blocks that appear
// transposed (Kᵀ in Q·Kᵀ, Vᵀ in dO·Vᵀ) are transposed per tile into a panel [D, BK]. This
// also escapes OPENBLAS_CORETYPE=Haswell, which keeps OpenBLAS on 8-lane AVX2 kernels here.
// Elsewhere (f64, or no AVX-512): OpenBLAS.

bool use_micro_kernel() { return vec16::has_avx512f(); }
using vec16::micro_tile;  // R × 16·V tile of C, accumulated in registers

// Rows [0, M) of one column strip of width 16·V: R rows at a time, then one at a time.
template <int R, int V>
[[gnu::always_inline]] inline void micro_strip(int64_t M, int64_t K, float alpha, const float* a, int64_t ars,
                                               int64_t acs, const float* b, int64_t ldb, float beta, float* c,
                                               int64_t ldc) {
  int64_t m = 0;
  for (; m + R <= M; m += R) micro_tile<R, V>(K, alpha, a + m * ars, ars, acs, b, ldb, beta, c + m * ldc, ldc);
  for (; m + 4 <= M; m += 4) micro_tile<4, V>(K, alpha, a + m * ars, ars, acs, b, ldb, beta, c + m * ldc, ldc);
  for (; m < M; ++m) micro_tile<1, V>(K, alpha, a + m * ars, ars, acs, b, ldb, beta, c + m * ldc, ldc);
}

// C[M×N] (ldc) = alpha · A · B + beta · C, A[m][k] = a[m·ars + k·acs], B[k][n] = b[k·ldb + n]:
// strips of 64 columns (6 × 4 registers), then of 32 (12 × 2: a head dim of 32, read once for both
// halves), then of 16 (8 × 1), then the last N % 16 columns plainly; leftover rows 4, then 1 at a time.
[[gnu::always_inline, gnu::target("avx512f")]] inline void gemm_strips(int64_t M, int64_t N, int64_t K, float alpha,
                                                                        const float* a, int64_t ars, int64_t acs,
                                                                        const float* b, int64_t ldb, float beta,
                                                                        float* c, int64_t ldc) {
  int64_t n = 0;
  for (; n + 64 <= N; n += 64) micro_strip<6, 4>(M, K, alpha, a, ars, acs, b + n, ldb, beta, c + n, ldc);
  for (; n + 32 <= N; n += 32) micro_strip<12, 2>(M, K, alpha, a, ars, acs, b + n, ldb, beta, c + n, ldc);
  for (; n + 16 <= N; n += 16) micro_strip<8, 1>(M, K, alpha, a, ars, acs, b + n, ldb, beta, c + n, ldc);
  for (int64_t m = 0; m < M && n < N; ++m)
    for (int64_t j = n; j < N; ++j) {
      float sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += a[m * ars + k * acs] * b[k * ldb + j];
      c[m * ldc + j] = beta == 0.0f ? alpha * sum : alpha * sum + beta * c[m * ldc + j];
    }
}
// A read down its columns (ars = 1: Pᵀ, dSᵀ, Vᵀ, dOᵀ, Qᵀ in the tiles) gets its own copy, where a
// tile's R values of A at one k are R neighbouring floats at fixed offsets: with ars a variable
// the 12-row strips kept the R row offsets on the stack and reloaded one per broadcast
// (decision 273).
__attribute__((target("avx512f"))) void gemm_avx512(int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                                                    int64_t ars, int64_t acs, const float* b, int64_t ldb, float beta,
                                                    float* c, int64_t ldc) {
  if (ars == 1) return gemm_strips(M, N, K, alpha, a, 1, acs, b, ldb, beta, c, ldc);
  gemm_strips(M, N, K, alpha, a, ars, acs, b, ldb, beta, c, ldc);
}

// 2^y for an AVX-512 caller, where a caller's exp(x) becomes 2^(x · log2 e) with the log2 e folded
// into a multiply it does anyway (exp(scale · s - m) = 2^(s · scale·log2 e - m·log2 e): one FMA
// either way): y = n + r with n = floor(y) (vrndscaleps) and r in [0, 1), 2^r by a degree-6
// polynomial (relative minimax on [0, 1), error 2e-9, below 1 ulp after f32 rounding), 2^n applied
// by vscalefps, zero-masked below -126 (where exp16 gives 0, and where a subnormal result would cost
// a microcode assist per vector): 11 instructions against 15 for exp16's reduction and polynomial
// with vscalefps, which multiplied by log2 e inside.
// -inf (a hidden score) gives 0.
constexpr float kLog2e = 1.44269504088896341f;
[[gnu::always_inline, gnu::target("avx512f")]] inline f32x16 exp2_avx512(f32x16 y) {
  const __mmask16 normal = _mm512_cmp_ps_mask(__m512(y), _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
  const f32x16 n = f32x16(_mm512_roundscale_ps(__m512(y), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
  const f32x16 r = y - n;
  f32x16 p = splat(2.16128523e-4f);
  p = p * r + 1.24678633e-3f;
  p = p * r + 9.67544969e-3f;
  p = p * r + 5.54852821e-2f;
  p = p * r + 2.40229309e-1f;
  p = p * r + 6.93147063e-1f;
  p = p * r + 1.0f;
  return f32x16(_mm512_maskz_scalef_ps(normal, __m512(p), __m512(n)));
}

// The backward's score products with the elementwise work fused into their register tiles:
// C = epi(A · B) for A [M, K] (rows a + m·ars), B [K, N] (rows b + k·ldb), N a multiple of 16, as
// gemm_avx512's strips; each finished 16-lane vector x of row m goes to epi(m, its place in C, x).
// ProbsEpi writes P = exp(scale · x - lse_m), DsEpi dS = P ∘ (x - Δ_m), the expressions of
// probs_and_ds on the stored scores without a pass over the two tiles; P's exp is exp2_avx512's
// (decision 255), within ~1 ulp of probs_and_ds's exp16, not the same bits.
// A tile with hidden keys (the causal diagonal, a document start, the window) runs them `masked`:
// row m keeps the columns [lo_m, hi_m), the others get P = 0 and dS = 0 (decision 271).
template <bool masked = false>
struct ProbsEpi {
  float scale2;       // scale · log2 e
  const float* lse2;  // [M] lse · log2 e
  const float* c0 = nullptr;  // masked: C's start, its row stride, and each row's visible columns
  int64_t ldc = 0;
  const int32_t *lo = nullptr, *hi = nullptr;  // [M]
  [[gnu::always_inline, gnu::target("avx512f")]] void operator()(int64_t m, float* c, f32x16 x) const {
    const f32x16 p = exp2_avx512(x * scale2 - lse2[m]);  // exp(scale · x - lse)
    if constexpr (masked) {
      constexpr vec16::i32x16 lane{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
      const vec16::i32x16 col = lane + int32_t((c - c0) - m * ldc);
      store(c, (col >= lo[m]) & (col < hi[m]) ? p : splat(0.0f));
    } else {
      store(c, p);
    }
  }
};
template <bool masked = false>
struct DsEpi {
  const float* p;      // P, laid out as C
  const float* ds;     // C's start
  const float* delta;  // [M]
  [[gnu::always_inline]] void operator()(int64_t m, float* c, f32x16 x) const {
    const f32x16 pj = load(p + (c - ds));
    if constexpr (masked) store(c, pj == 0.0f ? splat(0.0f) : pj * (x - delta[m]));  // 0 where hidden
    else store(c, pj * (x - delta[m]));
  }
};

// The forward's transposed scores (forward_small_d) with their column maxima: C = A·B as it is,
// and hi[n] = max(hi[n], C[m][n]) over the rows, from the register tiles (each tile's rows are
// reduced in registers first), so that no pass reads the tile for its maxima. The maxima of the
// same values, so the same bits as a pass over the stored tile.
struct MaxEpi {
  const float* c0;  // C's start
  int64_t ldc;
  float* hi;        // [N]
  [[gnu::always_inline]] void operator()(int64_t, float* c, f32x16 x) const { store(c, x); }
  [[gnu::always_inline]] void column_max(int64_t m0, const float* c, f32x16 x) const {
    float* h = hi + ((c - c0) - m0 * ldc);
    store(h, vmax(load(h), x));
  }
};

template <int R, int V, class Epi>
[[gnu::always_inline, gnu::target("avx512f")]] inline void epi_tile(int64_t m0, int64_t K, const float* a, int64_t ars,
                                                                    const float* b, int64_t ldb, float* c, int64_t ldc,
                                                                    const Epi& epi) {
  f32x16 acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = splat(0.0f);
  for (int64_t k = 0; k < K; ++k) {
    f32x16 bk[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bk[v] = load(b + k * ldb + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float ar = a[r * ars + k];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] += ar * bk[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) epi(m0 + r, c + r * ldc + 16 * v, acc[r][v]);
  if constexpr (requires { epi.column_max(m0, c, acc[0][0]); })
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      f32x16 hi = acc[0][v];
#pragma GCC unroll 16
      for (int r = 1; r < R; ++r) hi = vmax(hi, acc[r][v]);
      epi.column_max(m0, c + 16 * v, hi);
    }
}

template <int R, int V, class Epi>
[[gnu::always_inline, gnu::target("avx512f")]] inline void epi_strip(int64_t M, int64_t K, const float* a, int64_t ars,
                                                                     const float* b, int64_t ldb, float* c, int64_t ldc,
                                                                     const Epi& epi) {
  int64_t m = 0;
  for (; m + R <= M; m += R) epi_tile<R, V>(m, K, a + m * ars, ars, b, ldb, c + m * ldc, ldc, epi);
  for (; m + 4 <= M; m += 4) epi_tile<4, V>(m, K, a + m * ars, ars, b, ldb, c + m * ldc, ldc, epi);
  for (; m < M; ++m) epi_tile<1, V>(m, K, a + m * ars, ars, b, ldb, c + m * ldc, ldc, epi);
}

template <class Epi>
__attribute__((target("avx512f"))) void gemm_epi(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars,
                                                 const float* b, int64_t ldb, float* c, int64_t ldc, const Epi& epi) {
  int64_t n = 0;
  for (; n + 64 <= N; n += 64) epi_strip<6, 4>(M, K, a, ars, b + n, ldb, c + n, ldc, epi);
  for (; n + 32 <= N; n += 32) epi_strip<12, 2>(M, K, a, ars, b + n, ldb, c + n, ldc, epi);
  for (; n + 16 <= N; n += 16) epi_strip<8, 1>(M, K, a, ars, b + n, ldb, c + n, ldc, epi);
}

// C[M×N] (ldc) = alpha · op(A) · op(B) + beta · C; op(A) is M×K, op(B) is K×N (row-major).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (!tb && use_micro_kernel()) return gemm_avx512(M, N, K, alpha, a, ta ? 1 : lda, ta ? lda : 1, b, ldb, beta, c, ldc);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(M),
              blasint(N), blasint(K), alpha, a, blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
}
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(M),
              blasint(N), blasint(K), alpha, a, blasint(lda), b, blasint(ldb), beta, c, blasint(ldc));
}

// The key rows [bk, D] of a tile, transposed into `panel` [D, BK] on the micro-kernel path (per-
// thread scratch; the columns up to bk rounded to 16 are written, zero past bk; that costs bk·D
// moves against M·bk·D FMAs). The BLAS path reads the rows as they are and needs no panel.
__attribute__((target("avx512f"))) void keys_panel_avx512(int64_t bk, int64_t D, const float* rows, float* panel,
                                                           int64_t BK) {
  const int64_t n = std::min(BK, (bk + 15) / 16 * 16);
  // 16 keys at a time, so that their rows stay in L1 while each d writes one cache line; 16 keys by
  // 16 dims of a full block are transposed in registers.
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t w = std::min<int64_t>(16, bk - j0);
    int64_t d0 = 0;
    if (w == 16)
      for (; d0 + 16 <= D; d0 += 16) {
        vec16::f32x16 v[16];
#pragma GCC unroll 16
        for (int64_t j = 0; j < 16; ++j) v[j] = load(rows + (j0 + j) * D + d0);
        vec16::transpose16(v);
#pragma GCC unroll 16
        for (int64_t d = 0; d < 16; ++d) store(panel + (d0 + d) * BK + j0, v[d]);
      }
    for (int64_t d = d0; d < D; ++d) {
      float* dst = panel + d * BK + j0;
      for (int64_t j = 0; j < w; ++j) dst[j] = rows[(j0 + j) * D + d];
      for (int64_t j = std::max<int64_t>(w, 0); j < 16; ++j) dst[j] = 0.0f;
    }
  }
}
void keys_panel(int64_t bk, int64_t D, const float* rows, float* panel, int64_t BK) {
  if (use_micro_kernel()) keys_panel_avx512(bk, D, rows, panel, BK);
}
void keys_panel(int64_t, int64_t, const double*, double*, int64_t) {}

// s [M, n] (ldc) = a [M, D] · (key rows [n, D])ᵀ, after keys_panel of at least n keys (the micro-
// kernel path writes the columns up to n rounded to 16, which hold 0 past the tile's keys).
void scores(int64_t M, int64_t n, int64_t D, const float* a, const float* rows, const float* panel, int64_t BK,
            float* c, int64_t ldc) {
  if (!use_micro_kernel()) return gemm(false, true, M, n, D, 1.0f, a, D, rows, D, 0.0f, c, ldc);
  gemm(false, false, M, std::min(BK, (n + 15) / 16 * 16), D, 1.0f, a, D, panel, BK, 0.0f, c, ldc);
}
void scores(int64_t M, int64_t n, int64_t D, const double* a, const double* rows, const double*, int64_t, double* c,
            int64_t ldc) {
  gemm(false, true, M, n, D, 1.0, a, D, rows, D, 0.0, c, ldc);
}

// The tile products of the kernel bodies below on f32 or f64 operands, per thread (Bf16Tiles is
// the same contract on bf16 operands): keys() prepares a key block for scores(); values() a block
// of V (forward) or K (backward) for times_values(); queries() and probs() a query block and a
// finished P, dS tile for key_grads().
template <class T>
struct WideTiles {
  int64_t D, LT;
  AlignedTile<T> panel;  // [D, BK] a key block transposed (row stride LT)
  const T* key_rows = nullptr;
  const T* value_rows = nullptr;
  const T *q = nullptr, *dout = nullptr, *p = nullptr, *ds = nullptr;

  WideTiles(int64_t D, int64_t, int64_t LT)
      : D(D), LT(LT), panel(D * LT), transposed(std::is_same_v<T, float> && D < 32 && use_micro_kernel()) {}
  const T* pan = nullptr;  // keys()'s block transposed: panel, or a place in a task panel
  int64_t ldpan = 0;
  void keys(int64_t bk, const T* rows) {
    key_rows = rows;
    for (TaskPanel& t : task)
      if (t.n > 0 && rows >= t.rows && rows + bk * D <= t.rows + t.n * D) {
        pan = t.panel.data() + (rows - t.rows) / D, ldpan = t.ld;
        return;
      }
    keys_panel(bk, D, rows, panel.data(), LT);
    pan = panel.data(), ldpan = LT;
  }
  void scores(int64_t M, int64_t n, const T* a, T* c) { autosp::cpu::scores(M, n, D, a, key_rows, pan, ldpan, c, LT); }

  // The backward's task panels (decision 272): a task's key and value rows [n, D] transposed once,
  // [D, n] (row stride ld), for all its query heads and query blocks, where both fit in
  // kTaskPanelFloats; keys() then points into them instead of transposing each tile's keys again.
  struct TaskPanel {
    AlignedTile<T> panel;
    const T* rows = nullptr;
    int64_t n = 0, ld = 0, capacity = 0;
  };
  TaskPanel task[2];
  void task_panels(const T* krows, const T* vrows, int64_t n) {
    task[0].n = task[1].n = 0;
    const int64_t ld = (n + 15) / 16 * 16 + kTilePad;
    if (!std::is_same_v<T, float> || !use_micro_kernel() || 2 * D * ld > kTaskPanelFloats) return;
    for (int i = 0; i < 2; ++i) {
      TaskPanel& t = task[i];
      if (t.capacity < D * ld) t.capacity = D * ld, t.panel.resize(t.capacity);
      t.rows = i == 0 ? krows : vrows, t.n = n, t.ld = ld;
      keys_panel(n, D, t.rows, t.panel.data(), ld);
    }
  }
  // The backward's P and dS of a tile from q, dO [bq, D] and the key and value rows [bk, D], their
  // elementwise work fused into the products (ProbsEpi, DsEpi); false where that path is absent
  // (f64, or no AVX-512): then the caller runs scores() and probs_and_ds. p, ds [bq, LT]. A tile
  // every row sees whole passes lo = hi = null; its columns from bk up to a multiple of 16 hold
  // garbage. Otherwise row i sees the keys [lo[i], hi[i]) of the tile (lo ≤ hi ≤ bk): the rows run
  // in strips of kStrip, each up to its rows' last visible key, and every other column up to a
  // multiple of 16 gets P = dS = 0.
  bool fused_probs(int64_t bq, int64_t bk, const T* qp, const T* dop, const T* krows, const T* vrows, T scale,
                   const T* lse, const T* delta, T* p, T* ds, const int32_t* lo = nullptr,
                   const int32_t* hi = nullptr) {
    if constexpr (std::is_same_v<T, float>) {
      if (!use_micro_kernel()) return false;
      const int64_t n = (bk + 15) / 16 * 16;
      const float scale2 = float(scale * std::numbers::log2e);
      float lse2[kBackwardBlockQ];
      for (int64_t i = 0; i < bq; ++i) lse2[i] = lse[i] * kLog2e;
      if (lo == nullptr) {
        keys(bk, krows);
        gemm_epi(bq, n, D, qp, D, pan, ldpan, p, LT, ProbsEpi<>{scale2, lse2});
        keys(bk, vrows);
        gemm_epi(bq, n, D, dop, D, pan, ldpan, ds, LT, DsEpi<>{p, ds, delta});
        return true;
      }
      // The strips' widths: keys [0, w) of rows [r0, r1), w the strip's last visible key rounded up.
      int64_t width[(kBackwardBlockQ + kStrip - 1) / kStrip];
      for (int64_t r0 = 0; r0 < bq; r0 += kStrip) {
        int64_t w = 0;
        for (int64_t i = r0; i < std::min(bq, r0 + kStrip); ++i) w = std::max<int64_t>(w, hi[i]);
        width[r0 / kStrip] = (w + 15) / 16 * 16;
      }
      const auto strips = [&](const float* a, float* c, auto epi_at) {
        for (int64_t r0 = 0; r0 < bq; r0 += kStrip) {
          const int64_t r1 = std::min(bq, r0 + kStrip), w = width[r0 / kStrip];
          if (w > 0) gemm_epi(r1 - r0, w, D, a + r0 * D, D, pan, ldpan, c + r0 * LT, LT, epi_at(r0));
          for (int64_t i = r0; i < r1; ++i) std::fill(c + i * LT + w, c + i * LT + n, 0.0f);
        }
      };
      keys(bk, krows);
      strips(qp, p, [&](int64_t r0) {
        return ProbsEpi<true>{scale2, lse2 + r0, p + r0 * LT, LT, lo + r0, hi + r0};
      });
      keys(bk, vrows);
      strips(dop, ds, [&](int64_t r0) { return DsEpi<true>{p + r0 * LT, ds + r0 * LT, delta + r0}; });
      return true;
    }
    return false;
  }
  void values(int64_t, const T* rows) { value_rows = rows; }
  void times_values(int64_t M, int64_t n, T alpha, const T* pt, T* acc) {
    gemm(false, false, M, D, n, alpha, pt, LT, value_rows, D, T(1), acc, D);
  }
  void queries(int64_t, const T* qp, const T* dop) { q = qp, dout = dop; }
  void probs(int64_t, int64_t, const T* pt, const T* dst) { p = pt, ds = dst; }
  void key_grads(int64_t c0, int64_t c1, int64_t r0, int64_t bq, T scale, T* dv, T* dk) {
    if constexpr (std::is_same_v<T, float>)
      if (transposed) {  // dvᵀ [D, keys] += dOᵀ · p,  dkᵀ += scale · qᵀ · ds
        const int64_t j = (dv - dv_rows) / D;
        gemm_avx512(D, c1 - c0, bq - r0, 1.0f, dout + r0 * D, 1, D, p + r0 * LT + c0, LT, 1.0f, dvt.data() + j, ldt);
        gemm_avx512(D, c1 - c0, bq - r0, scale, q + r0 * D, 1, D, ds + r0 * LT + c0, LT, 1.0f, dkt.data() + j, ldt);
        return;
      }
    gemm(true, false, c1 - c0, D, bq - r0, T(1), p + r0 * LT + c0, LT, dout + r0 * D, D, T(1), dv, D);  // dv += pᵀ · dO
    gemm(true, false, c1 - c0, D, bq - r0, scale, ds + r0 * LT + c0, LT, q + r0 * D, D, T(1), dk, D);  // dk += scale · dsᵀ · q
  }

  // Small head dims (D < 32) accumulate a task's dK, dV transposed, [D, keys], which turns the
  // key gradients' products from D columns (one or two vectors, a broadcast per FMA) into key
  // columns read from the p, ds rows (4 vectors per broadcast); end_task transposes them into the
  // task's rows. Each element sums the same products in the same order either way, so the bits are
  // those of the row form. Key strips on the diagonal are then a multiple of 16 keys (key_strip).
  bool transposed = false;
  AlignedTile<T> dkt, dvt;  // [D, ldt]
  int64_t capacity = 0;     // of dkt, dvt
  int64_t ldt = 0, task_keys = 0;
  T *dk_rows = nullptr, *dv_rows = nullptr;
  int64_t key_strip() const { return transposed ? 32 : kStrip; }
  void begin_task(T* dkp, T* dvp, int64_t n) {
    if (!transposed) return;
    dk_rows = dkp, dv_rows = dvp, task_keys = n;
    ldt = (n + 15) / 16 * 16 + kTilePad;
    if (capacity < D * ldt) capacity = D * ldt, dkt.resize(capacity), dvt.resize(capacity);
    std::fill(dkt.data(), dkt.data() + D * ldt, T(0));
    std::fill(dvt.data(), dvt.data() + D * ldt, T(0));
  }
  void end_task() {
    if (!transposed) return;
    for (int64_t j = 0; j < task_keys; ++j)
      for (int64_t d = 0; d < D; ++d) dk_rows[j * D + d] = dkt[d * ldt + j], dv_rows[j * D + d] = dvt[d * ldt + j];
  }
};

#include "kernels/cpu/attention_bf16.inc.h"  // Bf16Tiles: the tile products on bf16 operands


// f(r0, r1, n) over the rows [0, M) of a tile bk keys wide: in one piece (n = bk) where its first
// row sees all bk keys, else strip by strip with n = limit(r1 - 1) (limit is non-decreasing).
template <class Limit, class F>
void row_strips(int64_t M, int64_t bk, Limit limit, F f) {
  if (M == 0) return;
  if (limit(0) >= bk) return f(0, M, bk);
  for (int64_t r0 = 0; r0 < M; r0 += kStrip) {
    const int64_t r1 = std::min(M, r0 + kStrip), n = limit(r1 - 1);
    if (n > 0) f(r0, r1, n);
  }
}

// The keys of a block from j0 (bk of them) that a query block visits as one tile, where every row
// of it sees the keys [begin, end): a block that starts before begin stops there, and one that
// starts inside stops at end rounded down to 16 keys, so that the keys every row sees form tiles
// of their own (the backward's fused products, the transposed forward's column maxima) and only
// the keys that the diagonal, a document start or the window crosses remain in masked tiles.
// Without it the causal query blocks of a short sequence, whose keys all fit one block, were one
// masked tile each: at S = 256 every tile of the backward.
int64_t whole_cut(int64_t j0, int64_t bk, int64_t begin, int64_t end) {
  if (j0 < begin) return std::min(bk, begin - j0);
  const int64_t whole = (end - j0) / 16 * 16;
  return whole > 0 && whole < bk ? whole : bk;
}

// Which keys a query row sees (kernels/attention_variant.h): causal (j ≤ i + shift), the window
// (j > i + shift - window) and the document (j ≥ doc_start[i]). Block skipping reads it twice: the
// keys [begin, end) a query block [i0, i0 + bq) can see at all are the only ones visited, and inside
// a key block at j0 a row sees [row_begin, row_limit). Both bounds are nondecreasing in i except
// for document starts that decrease (handled by taking the block's minimum).
struct Mask {
  bool causal = false;
  int64_t shift = 0, window = 0, Skv = 0;
  const int64_t* doc_start = nullptr;  // [Sq] of one batch, or null

  int64_t end(int64_t i0, int64_t bq) const { return causal ? std::clamp<int64_t>(i0 + bq + shift, 0, Skv) : Skv; }
  int64_t row_limit(int64_t i, int64_t j0, int64_t bk) const {
    return causal ? std::clamp<int64_t>(i + shift + 1 - j0, 0, bk) : bk;
  }
  // The first key row i sees, in key coordinates (may be < 0 or ≥ Skv).
  int64_t first(int64_t i) const {
    int64_t f = window > 0 ? i + shift - window + 1 : 0;
    if (doc_start != nullptr) f = std::max(f, doc_start[i]);
    return f;
  }
  int64_t begin(int64_t i0, int64_t bq) const {
    if (doc_start == nullptr && window == 0) return 0;
    int64_t lo = Skv;
    if (doc_start == nullptr) lo = first(i0);  // the window's bound grows with i
    else
      for (int64_t i = 0; i < bq; ++i) lo = std::min(lo, first(i0 + i));
    return std::clamp<int64_t>(lo, 0, Skv);
  }
  int64_t row_begin(int64_t i, int64_t j0, int64_t bk) const { return std::clamp<int64_t>(first(i) - j0, 0, bk); }
};

void check_sizes(const char* what, int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D) {
  AUTOSP_ASSERT(B >= 0 && Sq >= 0 && Skv >= 0 && D > 0, what, " sizes B ", B, " Sq ", Sq, " Skv ", Skv, " D ", D);
  AUTOSP_ASSERT(Nkv > 0 && N % Nkv == 0, what, " heads N ", N, " Nkv ", Nkv);
  AUTOSP_ASSERT(D <= std::numeric_limits<int>::max() && Skv <= std::numeric_limits<int>::max(), what, " D ", D,
                " Skv ", Skv);
}

template <class T>
void check_variant(const char* what, const AttentionVariant<T>& var) {
  AUTOSP_ASSERT(var.window >= 0 && var.softcap >= 0, what, " window ", var.window, " softcap ", var.softcap);
}

// Storage values: f32, f64 or bf16 (raw bits), read as double and written rounded once.
double as_double(double x) { return x; }
double as_double(float x) { return x; }
double as_double(uint16_t x) { return bf16_to_f32(x); }
// y[i] = x[i] rounded to bf16, in the calling thread (cast's loop would open a nested parallel
// region per call inside the kernels' own).
void round_into(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}
template <class S>
S narrow(double x) {
  if constexpr (std::is_same_v<S, uint16_t>) return f64_to_bf16(x);
  else return S(x);
}

// Σ_j a[j] · b[j] in double. For f32 in eight running sums (lanes j mod 8, one vector of doubles),
// added in a fixed order at the end: a single running sum waits on its add's latency per element.
AUTOSP_VEC16_CLONES double dot_double(const float* a, const float* b, int64_t n) {
  double acc[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += double(a[j + l]) * double(b[j + l]);
  for (; j < n; ++j) acc[j % 8] += double(a[j]) * double(b[j]);
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}
template <class S>
double dot_double(const S* a, const S* b, int64_t n) {
  double acc = 0;
  for (int64_t j = 0; j < n; ++j) acc += as_double(a[j]) * as_double(b[j]);
  return acc;
}

// dsinks[h] = -Σ_{b,i} exp(sink_h - lse_i) · Δ_i (kernels/attention_variant.h), per head in a fixed
// order (deterministic), in double.
template <class T, class S>
void sink_grads(const S* o, const T* lse, const S* dout, int64_t B, int64_t N, int64_t Sq, int64_t D,
                const AttentionVariant<T>& var) {
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < N; ++h) {
    double sum = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t row = (b * N + h) * Sq + i;
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) delta += as_double(dout[row * D + d]) * as_double(o[row * D + d]);
        sum += std::exp(double(var.sinks[h]) - double(lse[row])) * delta;
      }
    var.dsinks[h] = T(-sum);
  }
}

}  // namespace

namespace {

// The forward for small head dims (D ≤ 32) in f32 on the micro-kernel path, without a softcap
// (decisions 230, 271): the tiles are transposed, keys × queries. Sᵀ = K·Qᵀ reads the key rows as they
// are (Qᵀ is transposed once per query block, not a key panel per tile); the online softmax runs
// down the columns, 16 queries to a vector (no per-row calls, no horizontal reductions); and the
// output accumulates transposed, Oᵀ [D, BQ] += Vᵀ·Pᵀ, whose products stream P's rows 64 queries
// wide instead of D = 16 columns with a broadcast per FMA. A tile that holds hidden keys (the
// causal diagonal crosses it, or a document start or the window's reach) has its hidden scores set
// to -inf (under causal masking its scores skip, per strip of keys, the 16-query vectors that see
// none of them; decision 274); key blocks no query of the block sees are skipped as in forward(),
// and a key block is cut where the keys every query sees end (whole_cut).
// Query blocks of 64 (decision 271): at S = 256 the diagonal tiles, computed whole, cost 1.25× the
// visible products where 128 cost 1.5×, and 16k runs no slower.
constexpr int64_t kSmallBlockQ = 64, kSmallBlockK = 512;

bool small_d_forward(int64_t D, double scale, const AttentionVariant<float>& var) {
  return D <= 32 && use_micro_kernel() && scale > 0 && var.softcap == 0;
}

__attribute__((target("avx512f"))) void forward_small_d(const float* q, const float* k, const float* v, float* o,
                                                         float* lse, int64_t B, int64_t N, int64_t Nkv, int64_t Sq,
                                                         int64_t Skv, int64_t D, double scale, bool causal,
                                                         const int64_t* doc_start, const AttentionVariant<float>& var) {
  const int64_t group = N / Nkv;
  const int64_t BQ = kSmallBlockQ, BK = kSmallBlockK, LQ = BQ + kTilePad;
  const int64_t nqb = (Sq + BQ - 1) / BQ;
  const int64_t shift = Skv - Sq + var.offset;  // causal: query i sees keys j ≤ i + shift
  const float sc = float(scale), neg_inf = -std::numeric_limits<float>::infinity();
  const float sc2 = float(scale * std::numbers::log2e);  // the exp's multiply by log2 e, folded

#pragma omp parallel
  {
    AlignedTile<float> scratch((BK + 2 * D) * LQ);
    float* const st = scratch.data();  // [BK, BQ] scores, then probabilities (row stride LQ)
    float* const qt = st + BK * LQ;    // [D, BQ] the query block transposed
    float* const ot = qt + D * LQ;     // [D, BQ] unnormalised output, transposed
    std::vector<float> m(static_cast<size_t>(LQ));        // [BQ] running max of scaled scores
    std::vector<double> l(static_cast<size_t>(LQ));       // [BQ] running Σ exp(score - m)
    std::vector<int32_t> lo(static_cast<size_t>(LQ)), hi(lo.size());  // [BQ] query i sees keys [lo, hi)
    std::vector<float> cmax(static_cast<size_t>(LQ));                   // [BQ] a tile's column maxima

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * N * nqb; ++task) {
      // Late query blocks carry the most keys under causal masking: hand them out first.
      const int64_t qb = nqb - 1 - task % nqb, bh = task / nqb;
      const int64_t b = bh / N, h = bh % N;
      const int64_t i0 = qb * BQ, bq = std::min(BQ, Sq - i0), nq = (bq + 15) / 16 * 16;  // nq columns computed
      const float* qp = q + (bh * Sq + i0) * D;               // [bq, D]
      const float* kp = k + (b * Nkv + h / group) * Skv * D;  // [Skv, D]
      const float* vp = v + (b * Nkv + h / group) * Skv * D;  // [Skv, D]
      const Mask mask{causal, shift, var.window, Skv, doc_start == nullptr ? nullptr : doc_start + b * Sq};
      const int64_t kend = mask.end(i0, bq), kbeg = mask.begin(i0, bq);
      int64_t lo_max = 0, hi_min = Skv;  // a key block inside [lo_max, hi_min) needs no mask
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t a = i < bq ? std::clamp<int64_t>(mask.first(i0 + i), 0, Skv) : 0;
        const int64_t e = i < bq ? std::max(a, mask.row_limit(i0 + i, 0, Skv)) : Skv;
        lo[size_t(i)] = int32_t(a), hi[size_t(i)] = int32_t(e);
        lo_max = std::max(lo_max, a), hi_min = std::min(hi_min, e);
      }

      keys_panel_avx512(bq, D, qp, qt, LQ);  // qᵀ, 0 past bq
      std::fill(m.begin(), m.begin() + nq, neg_inf);
      std::fill(l.begin(), l.begin() + nq, 0.0);
      std::fill(ot, ot + D * LQ, 0.0f);

      for (int64_t j0 = kbeg, bk = 0; j0 < kend; j0 += bk) {
        bk = whole_cut(j0, std::min(BK, kend - j0), lo_max, hi_min);
        float* t = st;
        // sᵀ = k · qᵀ; a tile that hides no key takes its column maxima from the product's registers.
        const bool open = j0 >= lo_max && j0 + bk <= hi_min;
        if (open) {
          std::fill(cmax.begin(), cmax.begin() + nq, neg_inf);
          gemm_epi(bk, nq, D, kp + j0 * D, D, qt, LQ, t, LQ, MaxEpi{t, LQ, cmax.data()});
        } else if (!causal) {
          gemm_avx512(bk, nq, D, 1.0f, kp + j0 * D, D, 1, qt, LQ, 0.0f, t, LQ);
        } else {
          // Strips of kStrip keys from the first 16 queries that see the strip's first key: the
          // queries before see none of its keys, and the mask below sets their scores to -inf.
          for (int64_t r0 = 0; r0 < bk; r0 += kStrip) {
            const int64_t c0 = std::clamp<int64_t>(j0 + r0 - i0 - shift, 0, nq) / 16 * 16;
            gemm_avx512(std::min(kStrip, bk - r0), nq - c0, D, 1.0f, kp + (j0 + r0) * D, D, 1, qt + c0, LQ, 0.0f,
                        t + r0 * LQ + c0, LQ);
          }
        }
        // Key j0 + r is hidden from the queries with j0 + r ∉ [lo, hi); only the rows r outside
        // [lo_max - j0, hi_min - j0) hide any. Causal alone hides a prefix of the row's queries.
        for (int64_t r = 0; r < bk; r = r + 1 == lo_max - j0 ? std::max(r + 1, hi_min - j0) : r + 1) {
          if (j0 + r >= lo_max && j0 + r < hi_min) continue;
          float* tr = t + r * LQ;
          if (doc_start == nullptr && var.window == 0) {
            std::fill(tr, tr + std::clamp<int64_t>(j0 + r - i0 - shift, 0, nq), neg_inf);
            continue;
          }
          const vec16::i32x16 key = vec16::i32x16{} + int32_t(j0 + r);
          for (int64_t c = 0; c < nq; c += 16)
            store(tr + c, (key < load_i32(lo.data() + c)) | (key >= load_i32(hi.data() + c)) ? splat(neg_inf)
                                                                                             : load(tr + c));
        }
        for (int64_t c = 0; c < nq; c += 16) {
          f32x16 hi[4] = {splat(neg_inf), splat(neg_inf), splat(neg_inf), splat(neg_inf)};
          int64_t r = 0;
          if (open) hi[0] = load(cmax.data() + c);
          else {
            for (; r + 4 <= bk; r += 4)
#pragma GCC unroll 4
              for (int u = 0; u < 4; ++u) hi[u] = vmax(hi[u], load(t + (r + u) * LQ + c));
            for (; r < bk; ++r) hi[0] = vmax(hi[0], load(t + r * LQ + c));
          }
          const f32x16 m_old = load(m.data() + c);
          const f32x16 m_new = vmax(m_old, vmax(vmax(hi[0], hi[1]), vmax(hi[2], hi[3])) * sc);
          // A column that has seen no key yet keeps m = -inf; its p = exp(-inf) = 0 against m 0.
          const f32x16 m_use = m_new == neg_inf ? splat(0.0f) : m_new;
          const f32x16 m_use2 = m_use * kLog2e;  // exp(sc·s - m) = 2^(sc2·s - m2)
          f32x16 sum = splat(0.0f);
          for (r = 0; r < bk; ++r) {
            const f32x16 p = exp2_avx512(load(t + r * LQ + c) * sc2 - m_use2);
            store(t + r * LQ + c, p);
            sum += p;
          }
          const f32x16 alpha = exp16(m_old - m_use);  // 0 where the column saw no key before
          store(m.data() + c, m_new);
          for (int64_t d = 0; d < D; ++d) store(ot + d * LQ + c, load(ot + d * LQ + c) * alpha);
          for (int lane = 0; lane < 16; ++lane)
            l[size_t(c + lane)] = l[size_t(c + lane)] * double(alpha[lane]) + double(sum[lane]);
        }
        gemm_avx512(D, nq, bk, 1.0f, vp + j0 * D, 1, D, t, LQ, 1.0f, ot, LQ);  // oᵀ += vᵀ · pᵀ
      }

      float* op = o + (bh * Sq + i0) * D;  // [bq, D]
      for (int64_t i = 0; i < bq; ++i) {
        // The sink's exp(sink) joins the denominator: l' = l · e^(m - m') + e^(sink - m'), m' = max(m, sink).
        double mi = double(m[size_t(i)]), li = l[size_t(i)], rescale = 1.0;
        if (var.sinks != nullptr) {
          const double sink = double(var.sinks[h]), m2 = li > 0 ? std::max(mi, sink) : sink;
          rescale = li > 0 ? std::exp(mi - m2) : 0.0;
          li = li * rescale + std::exp(sink - m2), mi = m2;
        }
        const double inv = li > 0 ? rescale / li : 0.0;
        for (int64_t d = 0; d < D; ++d) op[i * D + d] = float(double(ot[d * LQ + i]) * inv);
        if (lse != nullptr) lse[bh * Sq + i0 + i] = li > 0 ? float(mi + std::log(li)) : neg_inf;
      }
    }
  }
}

// sdpa_forward on storage S (T, or bf16 with T = f32) with the tile products of Tiles, o in O (S,
// or f32 for bf16: unrounded).
template <class T, class S, class Tiles, class O = S>
void forward(const S* q, const S* k, const S* v, O* o, T* lse, int64_t B, int64_t N, int64_t Nkv, int64_t Sq,
             int64_t Skv, int64_t D, double scale, bool causal, const int64_t* doc_start, const AttentionVariant<T>& var) {
  check_sizes("sdpa", B, N, Nkv, Sq, Skv, D);
  check_variant("sdpa", var);
  if constexpr (std::is_same_v<S, float>)
    if (small_d_forward(D, scale, var))
      return forward_small_d(q, k, v, o, lse, B, N, Nkv, Sq, Skv, D, scale, causal, doc_start, var);
  const int64_t group = N / Nkv;  // query heads per kv head
  const int64_t BQ = kForwardBlockQ, BK = kForwardBlockK, LT = BK + kTilePad;
  const int64_t nqb = (Sq + BQ - 1) / BQ;
  const int64_t shift = Skv - Sq + var.offset;  // causal: query i sees keys j ≤ i + shift
  // With a softcap the row is capped first (scale folded in), then exponentiated at scale 1.
  const T sc = var.softcap > 0 ? T(1) : T(scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();

#pragma omp parallel
  {
    AlignedTile<T> s(BQ * LT);    // [BQ, BK] scores, then probabilities (row stride LT)
    Tiles tiles(D, BQ, LT);
    std::vector<T> acc(static_cast<size_t>(BQ * D));   // [BQ, D] unnormalised output
    std::vector<T> m(static_cast<size_t>(BQ));         // [BQ] running max of scaled scores
    std::vector<double> l(static_cast<size_t>(BQ));    // [BQ] running Σ exp(score - m)

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * N * nqb; ++task) {
      // Late query blocks carry the most keys under causal masking: hand them out first.
      const int64_t qb = nqb - 1 - task % nqb, bh = task / nqb;
      const int64_t b = bh / N, h = bh % N;
      const int64_t i0 = qb * BQ, bq = std::min(BQ, Sq - i0);
      const S* qp = q + (bh * Sq + i0) * D;                    // [bq, D]
      const S* kp = k + (b * Nkv + h / group) * Skv * D;       // [Skv, D]
      const S* vp = v + (b * Nkv + h / group) * Skv * D;       // [Skv, D]
      const Mask mask{causal, shift, var.window, Skv, doc_start == nullptr ? nullptr : doc_start + b * Sq};
      const int64_t kend = mask.end(i0, bq), kbeg = mask.begin(i0, bq);

      std::fill(m.begin(), m.begin() + bq, neg_inf);
      std::fill(l.begin(), l.begin() + bq, 0.0);
      std::fill(acc.begin(), acc.begin() + bq * D, T(0));

      for (int64_t j0 = kbeg; j0 < kend; j0 += BK) {
        const int64_t bk = std::min(BK, kend - j0);
        const auto limit = [&](int64_t i) { return mask.row_limit(i0 + i, j0, bk); };
        // s [bq, bk] = q [bq, D] · k[j0 : j0+bk]ᵀ, each row up to its limit at least
        tiles.keys(bk, kp + j0 * D);
        row_strips(bq, bk, limit, [&](int64_t r0, int64_t r1, int64_t n) {
          tiles.scores(r1 - r0, n, qp + r0 * D, s.data() + r0 * LT);
        });
        for (int64_t i = 0; i < bq; ++i) {
          T* si = s.data() + i * LT;
          const int64_t lim = limit(i);
          const int64_t lo = std::min(mask.row_begin(i0 + i, j0, bk), lim);  // keys [lo, lim) are visible
          std::fill(si, si + lo, T(0));
          std::fill(si + lim, si + bk, T(0));
          if (lim == lo) continue;  // the row sees nothing here: p = 0, state unchanged
          if (var.softcap > 0) softcap_row(si + lo, lim - lo, T(scale), T(var.softcap));
          const T m_new = std::max(m[i], max_scaled(si + lo, lim - lo, sc));
          const T alpha = std::exp(m[i] - m_new);  // 0 on the row's first visible block
          l[i] = l[i] * double(alpha) + double(exp_sum(si + lo, lim - lo, sc, m_new));
          m[i] = m_new;
          if (alpha != T(1)) {
            T* ai = acc.data() + i * D;
            for (int64_t d = 0; d < D; ++d) ai[d] *= alpha;
          }
        }
        // acc [bq, D] += p [bq, bk] · v[j0 : j0+bk] [bk, D] (p is 0 past each row's limit)
        tiles.values(bk, vp + j0 * D);
        row_strips(bq, bk, limit, [&](int64_t r0, int64_t r1, int64_t n) {
          tiles.times_values(r1 - r0, n, T(1), s.data() + r0 * LT, acc.data() + r0 * D);
        });
      }

      O* op = o + (bh * Sq + i0) * D;  // [bq, D]
      for (int64_t i = 0; i < bq; ++i) {
        // The sink's exp(sink) joins the denominator: l' = l · e^(m - m') + e^(sink - m'), m' = max(m, sink).
        double mi = double(m[i]), li = l[i], rescale = 1.0;
        if (var.sinks != nullptr) {
          const double sink = double(var.sinks[h]), m2 = li > 0 ? std::max(mi, sink) : sink;
          rescale = li > 0 ? std::exp(mi - m2) : 0.0;
          li = li * rescale + std::exp(sink - m2), mi = m2;
        }
        const double inv = li > 0 ? rescale / li : 0.0;
        for (int64_t d = 0; d < D; ++d) op[i * D + d] = narrow<O>(double(acc[i * D + d]) * inv);
        if (lse != nullptr) lse[bh * Sq + i0 + i] = li > 0 ? T(mi + std::log(li)) : neg_inf;
      }
    }
  }
}

}  // namespace

template <class T>
void sdpa_forward(const T* q, const T* k, const T* v, T* o, T* lse, int64_t B, int64_t N, int64_t Nkv,
                  int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, const int64_t* doc_start,
                  const AttentionVariant<T>& var) {
  forward<T, T, WideTiles<T>>(q, k, v, o, lse, B, N, Nkv, Sq, Skv, D, scale, causal, doc_start, var);
}

namespace {

// The backward's query chunks per (b, kv head), from the sizes alone: chunk c holds query blocks
// [c·nqb/C, (c+1)·nqb/C) and sees keys [0, key_end[c]). The last chunk (it sees every key)
// accumulates its dK, dV in dk, dv themselves (in the workspace too, after the others, with
// `last_too`: the bf16 kernel accumulates in f32); each earlier chunk c in its own key_end[c] rows
// of the workspace, at part_row[c] within its (b, kv head)'s `rows` (all dK parts first, then the
// dV parts, B·Nkv·rows·D apart).
struct BackwardChunks {
  int64_t nqb = 0, C = 1, rows = 0;
  std::vector<int64_t> key_end, part_row;
  BackwardChunks(int64_t B, int64_t Nkv, int64_t Sq, int64_t Skv, bool causal, int64_t shift, bool last_too = false) {
    const int64_t BQ = kBackwardBlockQ;
    nqb = (Sq + BQ - 1) / BQ;
    C = std::clamp<int64_t>((kMinTasks + B * Nkv - 1) / std::max<int64_t>(B * Nkv, 1), 1,
                            std::min(kMaxChunks, std::max<int64_t>(nqb, 1)));
    key_end.resize(static_cast<size_t>(C));
    part_row.resize(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const int64_t qb1 = blocks(c).second;
      const Mask mask{causal, shift, 0, Skv, nullptr};
      key_end[c] = qb1 == 0 ? 0 : mask.end((qb1 - 1) * BQ, std::min(BQ, Sq - (qb1 - 1) * BQ));
      part_row[c] = rows;
      if (c < C - 1) rows += key_end[c];
      else if (last_too) rows += Skv;
    }
  }
  std::pair<int64_t, int64_t> blocks(int64_t c) const { return {c * nqb / C, (c + 1) * nqb / C}; }
};

}  // namespace

int64_t sdpa_backward_bf16_workspace(int64_t B, int64_t, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, bool causal) {
  return 2 * B * Nkv * BackwardChunks(B, Nkv, Sq, Skv, causal, Skv - Sq, true).rows * D;
}

int64_t sdpa_backward_workspace(int64_t B, int64_t, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, bool causal) {
  return 2 * B * Nkv * BackwardChunks(B, Nkv, Sq, Skv, causal, Skv - Sq).rows * D;
}

namespace {

// sdpa_backward on storage S (T, or bf16 with T = f32) with the tile products of Tiles, dq, dk, dv
// in O (S, or f32 for bf16: unrounded). Outputs in T (`wide`) are accumulated in place; bf16 ones
// accumulate in T (dq per query block, dk and dv in the workspace) and are rounded once.
template <class T, class S, class Tiles, class O = S>
void backward(const S* q, const S* k, const S* v, const S* o, const T* lse, const S* dout, O* dq, O* dk, O* dv,
              int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal,
              const int64_t* doc_start, T* workspace, const AttentionVariant<T>& var) {
  constexpr bool wide = std::is_same_v<O, T>;
  check_sizes("sdpa_backward", B, N, Nkv, Sq, Skv, D);
  check_variant("sdpa_backward", var);
  // The workspace is sized for offset 0 (sdpa_backward_workspace); ring chunk pairs bring none.
  AUTOSP_ASSERT(var.offset == 0 || workspace == nullptr, "sdpa_backward: a workspace with offset ", var.offset);
  const int64_t group = N / Nkv;  // query heads per kv head
  const int64_t BQ = kBackwardBlockQ, BK = kBackwardBlockK, LT = BK + kTilePad;
  const int64_t shift = Skv - Sq + var.offset;  // causal: query i sees keys j ≤ i + shift
  const T sc = T(scale), cap = T(var.softcap);
  const T neg_inf = -std::numeric_limits<T>::infinity();

  const BackwardChunks ch(B, Nkv, Sq, Skv, causal, shift, !wide);
  const int64_t C = ch.C, rows = ch.rows;
  const int64_t stride = B * Nkv * rows * D;
  // Not value-initialised: each chunk zeroes the rows it accumulates into.
  std::unique_ptr<T[]> own(workspace == nullptr && stride > 0 ? new T[static_cast<size_t>(2 * stride)] : nullptr);
  T* const part = workspace != nullptr ? workspace : own.get();

#pragma omp parallel
  {
    AlignedTile<T> p(BQ * LT), ds(BQ * LT);  // [BQ, BK] tiles, stride LT
    std::vector<T> delta(static_cast<size_t>(BQ));                                    // [BQ] Δ
    std::vector<int32_t> lo(static_cast<size_t>(BQ)), hi(lo.size());                  // [BQ] a masked tile's rows' keys
    std::vector<T> dq_acc(wide ? 0 : static_cast<size_t>(BQ * D));                    // [BQ, D] dq in T
    Tiles tiles(D, BQ, LT);
    int64_t key_strip = kStrip;  // keys per strip of a diagonal tile's key gradients
    if constexpr (requires { tiles.key_strip(); }) key_strip = tiles.key_strip();

    // Chunks late in the sequence see the most keys under causal masking: hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * Nkv * C; ++task) {
      const int64_t c = C - 1 - task % C, bkv = task / C, b = bkv / Nkv;
      const bool last = c == C - 1;
      const S* kp = k + bkv * Skv * D;  // [Skv, D]
      const S* vp = v + bkv * Skv * D;
      T* dkp = part + (bkv * rows + ch.part_row[c]) * D;  // row j at dkp + j·D
      T* dvp = dkp + stride;
      if constexpr (wide)
        if (last) dkp = dk + bkv * Skv * D, dvp = dv + bkv * Skv * D;
      std::fill(dkp, dkp + (last ? Skv : ch.key_end[c]) * D, T(0));
      std::fill(dvp, dvp + (last ? Skv : ch.key_end[c]) * D, T(0));
      if constexpr (requires { tiles.begin_task(dkp, dvp, 0); }) tiles.begin_task(dkp, dvp, last ? Skv : ch.key_end[c]);
      if constexpr (requires { tiles.task_panels(kp, vp, 0); }) tiles.task_panels(kp, vp, last ? Skv : ch.key_end[c]);
      const auto [qb0, qb1] = ch.blocks(c);
      const Mask mask{causal, shift, var.window, Skv, doc_start == nullptr ? nullptr : doc_start + b * Sq};
      for (int64_t h = (bkv % Nkv) * group; h < (bkv % Nkv + 1) * group; ++h) {
        const int64_t bh = b * N + h;
        for (int64_t qb = qb0; qb < qb1; ++qb) {
          const int64_t i0 = qb * BQ, bq = std::min(BQ, Sq - i0);
          const S* qp = q + (bh * Sq + i0) * D;      // [bq, D]
          const S* dop = dout + (bh * Sq + i0) * D;  // [bq, D]
          const S* orow = o + (bh * Sq + i0) * D;
          const T* lp = lse + bh * Sq + i0;          // [bq]
          O* dqp = dq + (bh * Sq + i0) * D;          // [bq, D]
          T* dqa = dq_acc.data();                    // dq's accumulator
          if constexpr (wide) dqa = dqp;
          std::fill(dqa, dqa + bq * D, T(0));
          for (int64_t i = 0; i < bq; ++i) delta[size_t(i)] = T(dot_double(dop + i * D, orow + i * D, D));  // Δ_i = Σ_d dO_i · O_i
          tiles.queries(bq, qp, dop);
          const int64_t kend = mask.end(i0, bq);
          // A key block from first_max on that every row sees up to its end is whole: with every
          // row's lse finite, its P and dS may come from the fused products.
          int64_t first_max = 0;
          bool seen = var.softcap == 0;
          for (int64_t i = 0; i < bq; ++i) first_max = std::max(first_max, mask.first(i0 + i)), seen &= lp[i] != neg_inf;
          for (int64_t j0 = mask.begin(i0, bq), bk = 0; j0 < kend; j0 += bk) {
            bk = whole_cut(j0, std::min(BK, kend - j0), first_max, j0 + mask.row_limit(i0, j0, BK));
            const auto limit = [&](int64_t i) { return mask.row_limit(i0 + i, j0, bk); };
            bool fused = false;
            if constexpr (requires { tiles.fused_probs(bq, bk, qp, dop, kp, vp, sc, lp, lp, p.data(), ds.data()); }) {
              if (seen && j0 >= first_max && limit(0) >= bk) {
                fused = tiles.fused_probs(bq, bk, qp, dop, kp + j0 * D, vp + j0 * D, sc, lp, delta.data(), p.data(),
                                          ds.data());
              } else if (var.softcap == 0) {  // row i sees the keys [lo, hi) of the tile; none if lse = -inf
                for (int64_t i = 0; i < bq; ++i) {
                  const int64_t lim = lp[i] == neg_inf ? 0 : limit(i);
                  hi[size_t(i)] = int32_t(lim), lo[size_t(i)] = int32_t(std::min(mask.row_begin(i0 + i, j0, bk), lim));
                }
                fused = tiles.fused_probs(bq, bk, qp, dop, kp + j0 * D, vp + j0 * D, sc, lp, delta.data(), p.data(),
                                          ds.data(), lo.data(), hi.data());
              }
            }
            if (!fused) {
            tiles.keys(bk, kp + j0 * D);  // p = q · kᵀ
            row_strips(bq, bk, limit, [&](int64_t r0, int64_t r1, int64_t n) {
              tiles.scores(r1 - r0, n, qp + r0 * D, p.data() + r0 * LT);
            });
            tiles.keys(bk, vp + j0 * D);  // ds = dO · vᵀ
            row_strips(bq, bk, limit, [&](int64_t r0, int64_t r1, int64_t n) {
              tiles.scores(r1 - r0, n, dop + r0 * D, ds.data() + r0 * LT);
            });
            for (int64_t i = 0; i < bq; ++i) {
              const int64_t lim = lp[i] == neg_inf ? 0 : limit(i);
              const int64_t lo = std::min(mask.row_begin(i0 + i, j0, bk), lim);  // keys [lo, lim) are visible
              T* pi = p.data() + i * LT;
              T* dsi = ds.data() + i * LT;
              std::fill(pi, pi + lo, T(0));
              std::fill(dsi, dsi + lo, T(0));
              if (var.softcap > 0)
                capped_probs_and_ds(pi + lo, dsi + lo, lim - lo, bk - lo, sc, cap, lp[i], delta[size_t(i)]);
              else
                probs_and_ds(pi + lo, dsi + lo, lim - lo, bk - lo, sc, lp[i], delta[size_t(i)]);
            }
            }
            tiles.probs(bq, bk, p.data(), ds.data());
            // Keys [c0, c1) are seen by the rows from the first whose limit passes c0 (p, ds are 0 above).
            const bool whole = limit(0) >= bk;
            for (int64_t c0 = 0; c0 < bk; c0 += whole ? bk : key_strip) {
              const int64_t c1 = whole ? bk : std::min(bk, c0 + key_strip);
              const int64_t r0 = whole ? 0 : std::clamp<int64_t>(c0 + j0 - i0 - shift, 0, bq);
              if (r0 == bq) continue;
              tiles.key_grads(c0, c1, r0, bq, sc, dvp + (j0 + c0) * D, dkp + (j0 + c0) * D);
            }
            tiles.values(bk, kp + j0 * D);
            row_strips(bq, bk, limit, [&](int64_t r0, int64_t r1, int64_t n) {  // dq += scale · ds · k
              tiles.times_values(r1 - r0, n, sc, ds.data() + r0 * LT, dqa + r0 * D);
            });
          }
          if constexpr (!wide) round_into(dqa, dqp, bq * D);
        }
      }
      if constexpr (requires { tiles.end_task(); }) tiles.end_task();
    }

    // dk, dv = the last chunk's dK, dV + Σ_{c < C-1} (chunk c's) in chunk order, over the keys
    // chunk c sees: an order that depends on the sizes only.
    // Without `wide`, the last chunk's sums are in the workspace too: they start the sum, and each
    // result is rounded once.
    if (C > 1 || !wide) {
#pragma omp for schedule(static)
      for (int64_t row = 0; row < B * Nkv * Skv; ++row) {
        const int64_t bkv = row / Skv, j = row % Skv;
        T* dkr = part + (bkv * rows + ch.part_row[C - 1] + j) * D;
        T* dvr = dkr + stride;
        if constexpr (wide) dkr = dk + row * D, dvr = dv + row * D;
        for (int64_t c = 0; c < C - 1; ++c) {
          if (j >= ch.key_end[c]) continue;
          const T* pk = part + (bkv * rows + ch.part_row[c] + j) * D;
          const T* pv = pk + stride;
          for (int64_t d = 0; d < D; ++d) dkr[d] += pk[d], dvr[d] += pv[d];
        }
        if constexpr (!wide) round_into(dkr, dk + row * D, D), round_into(dvr, dv + row * D, D);
      }
    }
  }
  if (var.sinks != nullptr && var.dsinks != nullptr) sink_grads(o, lse, dout, B, N, Sq, D, var);
}

}  // namespace

template <class T>
void sdpa_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk,
                   T* dv, int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale,
                   bool causal, const int64_t* doc_start, T* workspace, const AttentionVariant<T>& var) {
  backward<T, T, WideTiles<T>>(q, k, v, o, lse, dout, dq, dk, dv, B, N, Nkv, Sq, Skv, D, scale, causal, doc_start,
                               workspace, var);
}

bool sdpa_bf16_native(int64_t D) { return D % 2 == 0 && bf16_gemm_available(Bf16Gemm::avx512_bf16); }

bool sdpa_bf16_preferred(int64_t D) { return D >= 32 && sdpa_bf16_native(D); }

Bf16Gemm sdpa_bf16_path() { return bf16_gemm_best() == Bf16Gemm::amx ? Bf16Gemm::amx : Bf16Gemm::avx512_bf16; }

namespace {

// f.template operator()<Products>() with the tile products of `path` (amx, amx_emulated or avx512_bf16).
template <class F>
void with_products(Bf16Gemm path, F&& f) {
  AUTOSP_ASSERT(path != Bf16Gemm::f32 && bf16_gemm_available(path), "bf16 attention: the tile products' path ",
                bf16_gemm_name(path), " is not available here");
  if (path == Bf16Gemm::amx) return f.template operator()<AmxProducts<amx::HwTiles>>();
  if (path == Bf16Gemm::amx_emulated) return f.template operator()<AmxProducts<amx::EmulatedTiles>>();
  f.template operator()<DpProducts>();
}

}  // namespace

template <class O>
void sdpa_forward_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, O* o, float* lse, int64_t B,
                       int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal,
                       const int64_t* doc_start, const AttentionVariant<float>& var, Bf16Gemm path) {
  AUTOSP_ASSERT(sdpa_bf16_native(D), "sdpa_forward_bf16: needs AVX512-BF16 and an even head dim, D ", D);
  with_products(path, [&]<class P>() {
    forward<float, uint16_t, Bf16Tiles<P>, O>(q, k, v, o, lse, B, N, Nkv, Sq, Skv, D, scale, causal, doc_start, var);
  });
}

template <class O>
void sdpa_backward_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* o, const float* lse,
                        const uint16_t* dout, O* dq, O* dk, O* dv, int64_t B, int64_t N, int64_t Nkv, int64_t Sq,
                        int64_t Skv, int64_t D, double scale, bool causal, const int64_t* doc_start, float* workspace,
                        const AttentionVariant<float>& var, Bf16Gemm path) {
  AUTOSP_ASSERT(sdpa_bf16_native(D), "sdpa_backward_bf16: needs AVX512-BF16 and an even head dim, D ", D);
  AUTOSP_ASSERT(var.offset == 0 || workspace == nullptr, "sdpa_backward_bf16: a workspace with offset ", var.offset);
  with_products(path, [&]<class P>() {
    backward<float, uint16_t, Bf16Tiles<P>, O>(q, k, v, o, lse, dout, dq, dk, dv, B, N, Nkv, Sq, Skv, D, scale,
                                               causal, doc_start, workspace, var);
  });
}

template void sdpa_forward_bf16<uint16_t>(const uint16_t*, const uint16_t*, const uint16_t*, uint16_t*, float*,
                                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool,
                                          const int64_t*, const AttentionVariant<float>&, Bf16Gemm);
template void sdpa_forward_bf16<float>(const uint16_t*, const uint16_t*, const uint16_t*, float*, float*, int64_t,
                                       int64_t, int64_t, int64_t, int64_t, int64_t, double, bool, const int64_t*,
                                       const AttentionVariant<float>&, Bf16Gemm);
template void sdpa_backward_bf16<uint16_t>(const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                           const float*, const uint16_t*, uint16_t*, uint16_t*, uint16_t*, int64_t,
                                           int64_t, int64_t, int64_t, int64_t, int64_t, double, bool, const int64_t*,
                                           float*, const AttentionVariant<float>&, Bf16Gemm);
template void sdpa_backward_bf16<float>(const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                        const float*, const uint16_t*, float*, float*, float*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t, int64_t, double, bool, const int64_t*, float*,
                                        const AttentionVariant<float>&, Bf16Gemm);

template void sdpa_forward<float>(const float*, const float*, const float*, float*, float*, int64_t,
                                  int64_t, int64_t, int64_t, int64_t, int64_t, double, bool, const int64_t*,
                                  const AttentionVariant<float>&);
template void sdpa_forward<double>(const double*, const double*, const double*, double*, double*,
                                   int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool, const int64_t*,
                                   const AttentionVariant<double>&);
template void sdpa_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                   const float*, float*, float*, float*, int64_t, int64_t, int64_t, int64_t,
                                   int64_t, int64_t, double, bool, const int64_t*, float*,
                                   const AttentionVariant<float>&);
template void sdpa_backward<double>(const double*, const double*, const double*, const double*, const double*,
                                    const double*, double*, double*, double*, int64_t, int64_t, int64_t, int64_t,
                                    int64_t, int64_t, double, bool, const int64_t*, double*,
                                    const AttentionVariant<double>&);

template <class T>
void merge_attention(T* o, T* lse, const T* o_blk, const T* lse_blk, int64_t rows, int64_t D) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const double lb = double(lse_blk[r]), la = double(lse[r]);
    if (lse_blk[r] == neg_inf) continue;
    T* orow = o + r * D;
    const T* brow = o_blk + r * D;
    if (lse[r] == neg_inf) {
      std::copy(brow, brow + D, orow);
      lse[r] = lse_blk[r];
      continue;
    }
    const double m = std::max(la, lb), wa = std::exp(la - m), wb = std::exp(lb - m), sum = wa + wb;
    for (int64_t d = 0; d < D; ++d) orow[d] = T((double(orow[d]) * wa + double(brow[d]) * wb) / sum);
    lse[r] = T(m + std::log(sum));
  }
}

template void merge_attention<float>(float*, float*, const float*, const float*, int64_t, int64_t);
template void merge_attention<double>(double*, double*, const double*, const double*, int64_t, int64_t);

template <class T>
void causal_mask(const T* x, T* y, int64_t batch, int64_t Sq, int64_t Skv, T value) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < batch * Sq; ++r) {
    const int64_t i = r % Sq;
    const int64_t last = std::min(Skv, std::max<int64_t>(0, i + (Skv - Sq) + 1));  // keys [0, last) are visible
    const T* xr = x + r * Skv;
    T* yr = y + r * Skv;
    for (int64_t j = 0; j < last; ++j) yr[j] = xr[j];
    for (int64_t j = last; j < Skv; ++j) yr[j] = value;
  }
}

template void causal_mask<float>(const float*, float*, int64_t, int64_t, int64_t, float);
template void causal_mask<double>(const double*, double*, int64_t, int64_t, int64_t, double);

}  // namespace autosp::cpu
