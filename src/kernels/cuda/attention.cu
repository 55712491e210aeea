// CUDA flash attention (forward, backward) and the composite-attention causal mask. Knows nothing
// of graphs. Layouts and semantics: attention.cuh.
//
// ---- Tensor-core path (bf16, D ∈ {64, 128}; FlashAttention-2) ----
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate) with the fragment layouts of the PTX ISA, g = lane/4,
// t = lane%4:  A (16×16, row-major) a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
// a3 = (g+8, 2t+8..);  B (16×8, "col") b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g);
// C (16×8) c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1). Two bf16 in one register: the lower
// column (or k) index in the low half. Tiles live in shared memory row-major with rows padded by 8
// bf16 (16 bytes), which makes every fragment load below free of bank conflicts.
//   Forward: a block = 4 warps = 64 query rows (16 per warp) of one (b, head); it loops over key
//   tiles of 64: S = Q·Kᵀ (mma), scale + causal mask, online softmax in registers (each thread
//   owns rows g and g+8; row max / sum across the 4 threads of a quad with shuffles), rescale the
//   O accumulator, O += P·V (P re-packed from the S accumulators as A fragments, never stored).
//   Scores are kept in log2 units (scale·log2 e) and exponentiated with exp2f.
//   Backward: Δ = rowsum(dout ∘ o) first (warp per row). dk/dv: a block owns 64 keys (16 per warp)
//   of one (b, kv head) and loops over the group's query heads and the query tiles that see its
//   keys: Sᵀ = K·Qᵀ, dPᵀ = V·doutᵀ, Pᵀ = exp2(Sᵀ·scale - lse), dSᵀ = Pᵀ ∘ (dPᵀ - Δ), dv += Pᵀ·dout,
//   dk += dSᵀ·q (both with the transposed tiles re-packed from registers). dq: a block owns 64
//   query rows and loops over the key tiles they see: S, dP = dout·Vᵀ, dS, dq += dS·K. dq costs a
//   second computation of S and dP (7 tile GEMMs instead of FlashAttention-2's 5): the price of a
//   race-free, fixed-order dq.
//
// ---- SIMT path (float, other head dims, and the reference for bf16) ----
// One warp per row, 8 rows per block, tiles of 32 rows of the other operand in shared memory
// (fp32, padded to an odd stride): lane j takes the dot products for row j of the tile, the
// warp combines with shuffles (online softmax in the forward), and each lane accumulates
// D/32 output columns. Forward: rows are queries, tiles are keys. dk/dv: rows are keys, tiles are
// queries (of every head of the GQA group). dq: rows are queries, tiles are keys.
//
// Both paths: the loops over tiles, heads and lanes run in a fixed order, so results are
// bitwise reproducible; causal blocks skip the tiles no row of theirs can see, and the heaviest
// blocks (late queries) are launched first. Document masking (doc_start, [Sq] per batch, rising
// along the queries: the op's contract, checked on the host where batches are made) skips the
// tiles before a block's earliest document start (forward, dq), stops dk/dv at the first query
// tile whose first query starts past the block's last key (every later tile starts later still),
// and masks per element inside the others, with the tile's starts staged in shared memory (dk/dv).
// Sinks: a row's sink joins its denominator after its last tile (join_sink), in both forward
// kernels; the backward kernels are unchanged (the lse they read includes the sink) and dsinks is
// its own small kernel over lse and Δ (sdpa_sinks_grad_kernel).
#include "kernels/cuda/attention.cuh"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>

namespace autosp::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// SIMT tiling.
constexpr int kSimtWarps = 8;  // rows per block, one warp each
constexpr int kSimtTile = 32;  // rows of the other operand per shared tile: one per lane

// Tensor-core tiling.
constexpr int kMmaWarps = 4;
constexpr int kMmaRows = 16 * kMmaWarps;  // query rows (forward, dq) or key rows (dk/dv) per block
constexpr int kMmaKeys = 64;              // keys per tile (forward, dq)
template <int D>
inline constexpr int kKvQueryTile = D == 128 ? 32 : 64;  // queries per dk/dv tile: fewer registers at D = 128

}  // namespace

// ==== kernels ===================================================================================

#ifndef AUTOSP_CUDA_EMULATION  // the CPU emulation (tests/cuda/emulation.h) defines it as a plain array
extern __shared__ __align__(16) unsigned char attention_smem[];  // dynamic shared memory, tensor-core kernels
#endif

namespace {

// ---- shared helpers ----

// Δ[r] = Σ_d dout[r, d] · o[r, d], one warp per row.
template <class T>
__global__ void sdpa_delta_kernel(const T* o, const T* dout, float* delta, int64_t rows, int D) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (r >= rows) return;
  float s = 0.f;
  for (int d = lane; d < D; d += kWarp) s += to_acc(dout[r * D + d]) * to_acc(o[r * D + d]);
  s = warp_sum(s);
  if (lane == 0) delta[r] = s;
}

// dsinks[h] = -Σ_{b,i} exp(sinks[h] - lse[b, h, i]) · Δ[b, h, i] (kernels/attention_variant.h).
// grid N, block 256: thread t sums rows t, t + 256, … of the head's B·Sq in order, then block_sum's
// fixed tree, so the result does not depend on scheduling.
__global__ void sdpa_sinks_grad_kernel(const float* lse, const float* delta, const float* sinks, float* dsinks,
                                       int64_t B, int N, int64_t Sq) {
  __shared__ float part[kWarp];
  const int64_t h = blockIdx.x;
  const float sink = sinks[h];
  float s = 0.f;
  for (int64_t r = threadIdx.x; r < B * Sq; r += blockDim.x) {
    const int64_t row = ((r / Sq) * N + h) * Sq + r % Sq;
    s += expf(sink - lse[row]) * delta[row];  // lse ≥ sink: never -inf with a sink
  }
  s = block_sum(s, part);
  if (threadIdx.x == 0) dsinks[h] = -s;
}

template <class T>
__global__ void causal_mask_kernel(const T* x, T* y, int64_t total, int64_t Sq, int64_t Skv, T value) {
  AUTOSP_GRID_STRIDE(e, total) {
    const int64_t j = e % Skv, i = (e / Skv) % Sq;
    y[e] = j > i + (Skv - Sq) ? value : x[e];
  }
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// One past the last key that query `i` sees (0 for a query outside [0, Sq)).
__device__ __forceinline__ int64_t key_end(int64_t i, int64_t Sq, int64_t Skv, bool causal) {
  if (i < 0 || i >= Sq) return 0;
  if (!causal) return Skv;
  const int64_t e = i + (Skv - Sq) + 1;
  return e < 0 ? 0 : (e > Skv ? Skv : e);
}

// The first key query `i` sees under the document mask (0 without one or outside [0, Sq)).
__device__ __forceinline__ int64_t key_begin(const int64_t* starts, int64_t i, int64_t Sq) {
  return starts == nullptr || i < 0 || i >= Sq ? 0 : max64(starts[i], 0);
}

// The earliest first key of the queries [i0, i0 + n) ∩ [0, Sq), n ≤ 64, computed by a whole warp
// (every lane gets it; INT64_MAX when the range holds no query); 0 without a document mask.
__device__ __forceinline__ int64_t warp_key_begin(const int64_t* starts, int64_t i0, int n, int64_t Sq, int lane) {
  if (starts == nullptr) return 0;
  long long first = INT64_MAX;
  for (int r = lane; r < n; r += kWarp)
    if (i0 + r >= 0 && i0 + r < Sq) first = min64(first, max64(starts[i0 + r], 0));
  for (int o = 16; o > 0; o >>= 1) first = min64(first, __shfl_xor_sync(0xffffffffu, first, o));
  return first;
}

// ---- SIMT ----

// Loads rows [row0, row0 + 32) of src [rows, D] into dst [32][DP] as float, zeros outside.
template <class T, int DPL>
__device__ __forceinline__ void simt_load_tile(float (*dst)[kWarp * DPL + 1], const T* src, int64_t row0, int64_t rows,
                                               int D) {
  constexpr int W = kWarp * DPL;
  for (int idx = threadIdx.x; idx < kSimtTile * W; idx += blockDim.x) {
    const int r = idx / W, d = idx % W;
    const int64_t row = row0 + r;
    dst[r][d] = (row < rows && d < D) ? to_acc(src[row * D + d]) : 0.f;
  }
}

// One row of src [rows, D] into dst [32·DPL] as float (by one warp), zeros outside.
template <class T, int DPL>
__device__ __forceinline__ void simt_load_row(float* dst, const T* src, int64_t row, int64_t rows, int D, int lane) {
#pragma unroll
  for (int e = 0; e < DPL; ++e) {
    const int d = lane + kWarp * e;
    dst[d] = (row < rows && d < D) ? to_acc(src[row * D + d]) : 0.f;
  }
}

template <int DPL>
__device__ __forceinline__ float simt_dot(const float* a, const float* b) {
  float s = 0.f;
#pragma unroll 8
  for (int d = 0; d < kWarp * DPL; ++d) s += a[d] * b[d];
  return s;
}

// The logit of a scaled score s under a softcap (kernels/attention_variant.h; cap 0: none) and
// its derivative d logit / d s.
__device__ __forceinline__ float capped(float s, float cap, float& deriv) {
  if (cap == 0.f) return deriv = 1.f, s;
  const float t = tanhf(s / cap);
  deriv = 1.f - t * t;
  return cap * t;
}

// A sink joins a finished row's denominator once (kernels/attention_variant.h): with m' = max(m, sink),
// l' = l · e^(m - m') + e^(sink - m'), and the row's accumulator is to be scaled by the returned
// e^(m - m') (0 when the row saw no key: o = 0, lse = sink). kLog2: m and sink in log2 units (the
// tensor-core kernels), else natural.
template <bool kLog2>
__device__ __forceinline__ float join_sink(float sink, float& m, float& l) {
  const float m2 = l > 0.f ? fmaxf(m, sink) : sink;
  const float rescale = l > 0.f ? (kLog2 ? exp2f(m - m2) : expf(m - m2)) : 0.f;
  l = l * rescale + (kLog2 ? exp2f(sink - m2) : expf(sink - m2));
  m = m2;
  return rescale;
}

// grid (ceil(Sq / 8), B·N), block 256: warp w owns query row blockIdx·8 + w.
template <class T, int DPL>
__global__ void __launch_bounds__(kSimtWarps* kWarp)
    sdpa_forward_simt_kernel(const T* q, const T* k, const T* v, T* o, float* lse, int N, int Nkv, int64_t Sq,
                             int64_t Skv, int D, float scale, bool causal, const int64_t* doc_start, float softcap,
                             const float* sinks) {
  constexpr int W = kWarp * DPL;
  __shared__ float ks[kSimtTile][W + 1], vs[kSimtTile][W + 1];
  __shared__ float qs[kSimtWarps][W];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t qb = gridDim.x - 1 - blockIdx.x;  // late query blocks (most keys) first
  const int64_t bh = blockIdx.y, b = bh / N, hk = (bh % N) / (N / Nkv);
  const int64_t i = qb * kSimtWarps + warp;
  const T* kp = k + (b * Nkv + hk) * Skv * D;  // [Skv, D]
  const T* vp = v + (b * Nkv + hk) * Skv * D;
  simt_load_row<T, DPL>(qs[warp], q + bh * Sq * D, i, Sq, D, lane);
  const int64_t kend = key_end(min64(Sq - 1, qb * kSimtWarps + kSimtWarps - 1), Sq, Skv, causal);
  const int64_t row_end = key_end(i, Sq, Skv, causal);
  const int64_t* starts = doc_start == nullptr ? nullptr : doc_start + b * Sq;  // [Sq] of batch b
  const int64_t row_begin = key_begin(starts, i, Sq);
  float acc[DPL] = {};
  float m = -INFINITY, l = 0.f;
  for (int64_t j0 = warp_key_begin(starts, qb * kSimtWarps, kSimtWarps, Sq, lane); j0 < kend; j0 += kSimtTile) {
    __syncthreads();  // the previous tile is consumed
    simt_load_tile<T, DPL>(ks, kp, j0, Skv, D);
    simt_load_tile<T, DPL>(vs, vp, j0, Skv, D);
    __syncthreads();
    const bool visible = j0 + lane < row_end && j0 + lane >= row_begin;
    float deriv;
    const float s = visible ? capped(simt_dot<DPL>(qs[warp], ks[lane]) * scale, softcap, deriv) : -INFINITY;
    const float tmax = warp_max(s);
    if (tmax == -INFINITY) continue;  // uniform over the warp: nothing visible in this tile
    const float m_new = fmaxf(m, tmax);
    const float alpha = expf(m - m_new);  // 0 on the row's first visible tile
    const float p = visible ? expf(s - m_new) : 0.f;
    l = l * alpha + warp_sum(p);
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[e] *= alpha;
    for (int jj = 0; jj < kSimtTile; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
      for (int e = 0; e < DPL; ++e) acc[e] += pj * vs[jj][lane + kWarp * e];
    }
    m = m_new;
  }
  if (i < Sq) {
    const float rescale = sinks != nullptr ? join_sink<false>(sinks[bh % N], m, l) : 1.f;
    const float inv = l > 0.f ? rescale / l : 0.f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      const int d = lane + kWarp * e;
      if (d < D) o[(bh * Sq + i) * D + d] = from_acc<T>(acc[e] * inv);
    }
    if (lse != nullptr && lane == 0) lse[bh * Sq + i] = l > 0.f ? m + logf(l) : -INFINITY;
  }
}

// dk, dv. grid (ceil(Skv / 8), B·Nkv), block 256: warp w owns key row blockIdx·8 + w.
template <class T, int DPL>
__global__ void __launch_bounds__(kSimtWarps* kWarp)
    sdpa_backward_kv_simt_kernel(const T* q, const T* k, const T* v, const float* lse, const float* delta,
                                 const T* dout, T* dk, T* dv, int N, int Nkv, int64_t Sq, int64_t Skv, int D,
                                 float scale, bool causal, const int64_t* doc_start, float softcap) {
  constexpr int W = kWarp * DPL;
  __shared__ float qs[kSimtTile][W + 1], dos[kSimtTile][W + 1];
  __shared__ float ks[kSimtWarps][W], vs[kSimtWarps][W];
  __shared__ float lse_s[kSimtTile], delta_s[kSimtTile];
  __shared__ int64_t start_s[kSimtTile];  // the tile's queries' first keys (documents)
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t bkv = blockIdx.y, b = bkv / Nkv, hk = bkv % Nkv, group = N / Nkv;
  const int64_t j_first = int64_t(blockIdx.x) * kSimtWarps, j = j_first + warp;
  const int64_t shift = Skv - Sq;
  simt_load_row<T, DPL>(ks[warp], k + bkv * Skv * D, j, Skv, D, lane);
  simt_load_row<T, DPL>(vs[warp], v + bkv * Skv * D, j, Skv, D, lane);
  // Queries i see key j iff i ≥ j - shift: start at the tile of the block's first key.
  const int64_t qstart = causal ? max64(0, j_first - shift) / kSimtTile * kSimtTile : 0;
  const int64_t* starts = doc_start == nullptr ? nullptr : doc_start + b * Sq;  // [Sq] of batch b
  float dk_acc[DPL] = {}, dv_acc[DPL] = {};
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const int64_t bh = b * N + h;
    for (int64_t i0 = qstart; i0 < Sq; i0 += kSimtTile) {
      // Documents: once a tile's first query starts past this block's last key, so do all later ones.
      if (key_begin(starts, i0, Sq) > j_first + kSimtWarps - 1) break;
      __syncthreads();
      simt_load_tile<T, DPL>(qs, q + bh * Sq * D, i0, Sq, D);
      simt_load_tile<T, DPL>(dos, dout + bh * Sq * D, i0, Sq, D);
      if (threadIdx.x < kSimtTile) {
        const int64_t i = i0 + threadIdx.x;
        lse_s[threadIdx.x] = i < Sq ? lse[bh * Sq + i] : -INFINITY;
        delta_s[threadIdx.x] = i < Sq ? delta[bh * Sq + i] : 0.f;
        start_s[threadIdx.x] = key_begin(starts, i, Sq);
      }
      __syncthreads();
      const int64_t i = i0 + lane;
      const float li = lse_s[lane];
      const bool visible = j < Skv && j < key_end(i, Sq, Skv, causal) && j >= start_s[lane] && li != -INFINITY;
      if (!__any_sync(0xffffffffu, visible)) continue;
      float p = 0.f, ds = 0.f;
      if (visible) {
        float deriv;
        p = expf(capped(simt_dot<DPL>(qs[lane], ks[warp]) * scale, softcap, deriv) - li);
        ds = p * (simt_dot<DPL>(dos[lane], vs[warp]) - delta_s[lane]) * deriv;
      }
      for (int ii = 0; ii < kSimtTile; ++ii) {
        const float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
        for (int e = 0; e < DPL; ++e) {
          dv_acc[e] += pi * dos[ii][lane + kWarp * e];
          dk_acc[e] += dsi * qs[ii][lane + kWarp * e];
        }
      }
    }
  }
  if (j < Skv) {
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      const int d = lane + kWarp * e;
      if (d < D) {
        dk[(bkv * Skv + j) * D + d] = from_acc<T>(dk_acc[e] * scale);
        dv[(bkv * Skv + j) * D + d] = from_acc<T>(dv_acc[e]);
      }
    }
  }
}

// dq. grid (ceil(Sq / 8), B·N), block 256: warp w owns query row blockIdx·8 + w.
template <class T, int DPL>
__global__ void __launch_bounds__(kSimtWarps* kWarp)
    sdpa_backward_q_simt_kernel(const T* q, const T* k, const T* v, const float* lse, const float* delta, const T* dout,
                                T* dq, int N, int Nkv, int64_t Sq, int64_t Skv, int D, float scale, bool causal,
                                const int64_t* doc_start, float softcap) {
  constexpr int W = kWarp * DPL;
  __shared__ float ks[kSimtTile][W + 1], vs[kSimtTile][W + 1];
  __shared__ float qs[kSimtWarps][W], dos[kSimtWarps][W];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t qb = gridDim.x - 1 - blockIdx.x;
  const int64_t bh = blockIdx.y, b = bh / N, hk = (bh % N) / (N / Nkv);
  const int64_t i = qb * kSimtWarps + warp;
  const T* kp = k + (b * Nkv + hk) * Skv * D;
  const T* vp = v + (b * Nkv + hk) * Skv * D;
  simt_load_row<T, DPL>(qs[warp], q + bh * Sq * D, i, Sq, D, lane);
  simt_load_row<T, DPL>(dos[warp], dout + bh * Sq * D, i, Sq, D, lane);
  const float li = i < Sq ? lse[bh * Sq + i] : -INFINITY;
  const float di = i < Sq ? delta[bh * Sq + i] : 0.f;
  const int64_t kend = key_end(min64(Sq - 1, qb * kSimtWarps + kSimtWarps - 1), Sq, Skv, causal);
  const int64_t row_end = li == -INFINITY ? 0 : key_end(i, Sq, Skv, causal);
  const int64_t* starts = doc_start == nullptr ? nullptr : doc_start + b * Sq;  // [Sq] of batch b
  const int64_t row_begin = key_begin(starts, i, Sq);
  float acc[DPL] = {};
  for (int64_t j0 = warp_key_begin(starts, qb * kSimtWarps, kSimtWarps, Sq, lane); j0 < kend; j0 += kSimtTile) {
    __syncthreads();
    simt_load_tile<T, DPL>(ks, kp, j0, Skv, D);
    simt_load_tile<T, DPL>(vs, vp, j0, Skv, D);
    __syncthreads();
    const bool visible = j0 + lane < row_end && j0 + lane >= row_begin;
    if (!__any_sync(0xffffffffu, visible)) continue;
    float ds = 0.f;
    if (visible) {
      float deriv;
      const float p = expf(capped(simt_dot<DPL>(qs[warp], ks[lane]) * scale, softcap, deriv) - li);
      ds = p * (simt_dot<DPL>(dos[warp], vs[lane]) - di) * deriv;
    }
    for (int jj = 0; jj < kSimtTile; ++jj) {
      const float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
      for (int e = 0; e < DPL; ++e) acc[e] += dsj * ks[jj][lane + kWarp * e];
    }
  }
  if (i < Sq) {
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      const int d = lane + kWarp * e;
      if (d < D) dq[(bh * Sq + i) * D + d] = from_acc<T>(acc[e] * scale);
    }
  }
}

// ---- tensor cores ----

// c += a · b for one m16n8k16 tile (bf16 inputs, fp32 accumulators).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(AUTOSP_CUDA_EMULATION)
  emulated_mma_bf16(c, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // the launcher never picks this path below compute capability 8.0
#endif
}

// Two floats as a bf16x2 register: lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, sizeof(r));
  return r;
}

// Two bf16 of shared memory as a bf16x2 register: lo in the low half.
__device__ __forceinline__ uint32_t pack_raw(const bf16& lo, const bf16& hi) {
  return uint32_t(*reinterpret_cast<const uint16_t*>(&lo)) | (uint32_t(*reinterpret_cast<const uint16_t*>(&hi)) << 16);
}

__device__ __forceinline__ uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment of the 16×16 block at (r0, c0) of row-major X (leading dim ld).
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const bf16* x, int ld, int r0, int c0, int g, int t) {
  a[0] = ld32(x + (r0 + g) * ld + c0 + 2 * t);
  a[1] = ld32(x + (r0 + g + 8) * ld + c0 + 2 * t);
  a[2] = ld32(x + (r0 + g) * ld + c0 + 8 + 2 * t);
  a[3] = ld32(x + (r0 + g + 8) * ld + c0 + 8 + 2 * t);
}

// B fragment (16 k × 8 n) with B[k][n] = Y[n0 + n][k0 + k], Y row-major (e.g. K for Q·Kᵀ).
__device__ __forceinline__ void frag_b_nk(uint32_t (&b)[2], const bf16* y, int ld, int n0, int k0, int g, int t) {
  b[0] = ld32(y + (n0 + g) * ld + k0 + 2 * t);
  b[1] = ld32(y + (n0 + g) * ld + k0 + 8 + 2 * t);
}

// B fragment (16 k × 8 n) with B[k][n] = Z[k0 + k][n0 + n], Z row-major (e.g. V for P·V).
__device__ __forceinline__ void frag_b_kn(uint32_t (&b)[2], const bf16* z, int ld, int k0, int n0, int g, int t) {
  const bf16* p = z + (k0 + 2 * t) * ld + n0 + g;
  b[0] = pack_raw(p[0], p[ld]);
  b[1] = pack_raw(p[8 * ld], p[9 * ld]);
}

// Two products at once, over D: c1 += X1 [16 rows from r0] · Y1ᵀ and c2 += X2 · Y2ᵀ, each Y's first
// 8·NT rows (frag_b_nk), all four tiles in shared memory with leading dim ld. The backward's score
// pairs (S and dP, or Sᵀ and dPᵀ): their fragments loaded and their MMAs issued side by side.
template <int D, int NT>
__device__ __forceinline__ void mma_pair_nk(float (&c1)[NT][4], float (&c2)[NT][4], const bf16* x1, const bf16* y1,
                                            const bf16* x2, const bf16* y2, int ld, int r0, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a1[4], a2[4];
    frag_a(a1, x1, ld, r0, kk * 16, g, t);
    frag_a(a2, x2, ld, r0, kk * 16, g, t);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t b1[2], b2[2];
      frag_b_nk(b1, y1, ld, nt * 8, kk * 16, g, t);
      frag_b_nk(b2, y2, ld, nt * 8, kk * 16, g, t);
      mma_bf16(c1[nt], a1, b1);
      mma_bf16(c2[nt], a2, b2);
    }
  }
}

// A fragments of a 16×16 chunk kc of a 16×(8·NT) accumulator tile (C layout) as bf16: the
// FlashAttention-2 register reuse of P (or dS) as the A operand of the next product.
template <int NT>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c)[NT][4], int kc) {
  a[0] = pack_bf16(c[2 * kc][0], c[2 * kc][1]);
  a[1] = pack_bf16(c[2 * kc][2], c[2 * kc][3]);
  a[2] = pack_bf16(c[2 * kc + 1][0], c[2 * kc + 1][1]);
  a[3] = pack_bf16(c[2 * kc + 1][2], c[2 * kc + 1][3]);
}

// Rows [row0, row0 + rows) of src [*, D] (global) into dst [rows][D + 8] (shared), 16 bytes per
// thread step; rows at or past `valid` are zero.
template <int D>
__device__ __forceinline__ void mma_load_tile(bf16* dst, const bf16* src, int64_t row0, int64_t valid, int rows) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += blockDim.x) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < valid) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * D + c);
    *reinterpret_cast<uint4*>(dst + r * (D + 8) + c) = val;
  }
}

// Quad (4 lanes sharing g) reductions.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// grid (ceil(Sq / 64), B·N), block 128, dynamic shared memory Q, K, V [64][D + 8] bf16.
template <int D>
__global__ void __launch_bounds__(kMmaWarps* kWarp)
    sdpa_forward_mma_kernel(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, int N, int Nkv,
                            int64_t Sq, int64_t Skv, float scale_log2, bool causal, const int64_t* doc_start,
                            const float* sinks) {
  constexpr int LD = D + 8, NT = kMmaKeys / 8, DT = D / 8;
  bf16* qs = reinterpret_cast<bf16*>(attention_smem);  // [64][LD]
  bf16* ks = qs + kMmaRows * LD;                       // [64][LD]
  bf16* vs = ks + kMmaKeys * LD;                       // [64][LD]
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int64_t qb = gridDim.x - 1 - blockIdx.x;  // late query tiles (most keys) first
  const int64_t bh = blockIdx.y, b = bh / N, hk = (bh % N) / (N / Nkv);
  const int64_t q0 = qb * kMmaRows;
  const bf16* kp = k + (b * Nkv + hk) * Skv * D;  // [Skv, D]
  const bf16* vp = v + (b * Nkv + hk) * Skv * D;
  mma_load_tile<D>(qs, q + bh * Sq * D, q0, Sq, kMmaRows);
  const int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int64_t row_end[2] = {key_end(row[0], Sq, Skv, causal), key_end(row[1], Sq, Skv, causal)};
  const int64_t* starts = doc_start == nullptr ? nullptr : doc_start + b * Sq;  // [Sq] of batch b
  const int64_t row_begin[2] = {key_begin(starts, row[0], Sq), key_begin(starts, row[1], Sq)};
  const int64_t kend = key_end(min64(Sq, q0 + kMmaRows) - 1, Sq, Skv, causal);
  float oacc[DT][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int64_t j0 = warp_key_begin(starts, q0, kMmaRows, Sq, lane); j0 < kend; j0 += kMmaKeys) {
    __syncthreads();  // the previous K, V tiles are consumed (and Q is loaded)
    mma_load_tile<D>(ks, kp, j0, Skv, kMmaKeys);
    mma_load_tile<D>(vs, vp, j0, Skv, kMmaKeys);
    __syncthreads();
    // S [16 × 64] = Q [16 × D] · Kᵀ
    float s[NT][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      frag_a(a, qs, LD, warp * 16, kk * 16, g, t);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t bb[2];
        frag_b_nk(bb, ks, LD, nt * 8, kk * 16, g, t);
        mma_bf16(s[nt], a, bb);
      }
    }
    // Scale (log2 units), mask, row max over the quad.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = j0 + nt * 8 + 2 * t + (e & 1);
        s[nt][e] = key < row_end[e >> 1] && key >= row_begin[e >> 1] ? s[nt][e] * scale_log2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
      }
    float mu[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      mu[r] = m_new == -INFINITY ? 0.f : m_new;  // a row that has seen nothing yet: p = 0, no NaN
      alpha[r] = exp2f(m[r] - mu[r]);
      m[r] = m_new;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - mu[e >> 1]);
        rs[e >> 1] += s[nt][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + quad_sum(rs[r]);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      oacc[dt][0] *= alpha[0];
      oacc[dt][1] *= alpha[0];
      oacc[dt][2] *= alpha[1];
      oacc[dt][3] *= alpha[1];
    }
    // O [16 × D] += P [16 × 64] · V [64 × D]
#pragma unroll
    for (int kc = 0; kc < kMmaKeys / 16; ++kc) {
      uint32_t a[4];
      acc_to_a<NT>(a, s, kc);
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        uint32_t bb[2];
        frag_b_kn(bb, vs, LD, kc * 16, dt * 8, g, t);
        mma_bf16(oacc[dt], a, bb);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= Sq) continue;
    const float rescale = sinks != nullptr ? join_sink<true>(sinks[bh % N] * kLog2e, m[r], l[r]) : 1.f;
    const float inv = l[r] > 0.f ? rescale / l[r] : 0.f;
    bf16* orow = o + (bh * Sq + row[r]) * D;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * t) = pack_bf16(oacc[dt][2 * r] * inv, oacc[dt][2 * r + 1] * inv);
    if (lse != nullptr && t == 0) lse[bh * Sq + row[r]] = l[r] > 0.f ? m[r] * kLn2 + logf(l[r]) : -INFINITY;
  }
}

// dk, dv. grid (ceil(Skv / 64), B·Nkv), block 128: warp w owns keys blockIdx·64 + 16w + [0, 16).
// Dynamic shared memory: K, V [64][D + 8], Q, dout [BQ][D + 8] bf16, lse·log2e, Δ [BQ] float, the
// queries' first keys [BQ] int64 (documents).
template <int D>
__global__ void __launch_bounds__(kMmaWarps* kWarp)
    sdpa_backward_kv_mma_kernel(const bf16* q, const bf16* k, const bf16* v, const float* lse, const float* delta,
                                const bf16* dout, bf16* dk, bf16* dv, int N, int Nkv, int64_t Sq, int64_t Skv,
                                float scale, bool causal, const int64_t* doc_start) {
  constexpr int LD = D + 8, BQ = kKvQueryTile<D>, NT = BQ / 8, DT = D / 8;
  bf16* ks = reinterpret_cast<bf16*>(attention_smem);      // [64][LD]
  bf16* vs = ks + kMmaRows * LD;                           // [64][LD]
  bf16* qs = vs + kMmaRows * LD;                           // [BQ][LD]
  bf16* dos = qs + BQ * LD;                                // [BQ][LD]
  float* lse_s = reinterpret_cast<float*>(dos + BQ * LD);  // [BQ], log2 units
  float* delta_s = lse_s + BQ;                             // [BQ]
  int64_t* start_s = reinterpret_cast<int64_t*>(delta_s + BQ);  // [BQ] (8-byte aligned: BQ is even)
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int64_t bkv = blockIdx.y, b = bkv / Nkv, hk = bkv % Nkv, group = N / Nkv;
  const int64_t j0 = int64_t(blockIdx.x) * kMmaRows, shift = Skv - Sq;
  const float scale_log2 = scale * kLog2e;
  mma_load_tile<D>(ks, k + bkv * Skv * D, j0, Skv, kMmaRows);
  mma_load_tile<D>(vs, v + bkv * Skv * D, j0, Skv, kMmaRows);
  const int64_t key[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};  // this thread's rows of Sᵀ
  const int64_t qstart = causal ? max64(0, j0 - shift) / BQ * BQ : 0;
  const int64_t* starts = doc_start == nullptr ? nullptr : doc_start + b * Sq;  // [Sq] of batch b
  float dk_acc[DT][4] = {}, dv_acc[DT][4] = {};
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const int64_t bh = b * N + h;
    for (int64_t i0 = qstart; i0 < Sq; i0 += BQ) {
      // Documents: once a tile's first query starts past this block's last key, so do all later ones.
      if (key_begin(starts, i0, Sq) > j0 + kMmaRows - 1) break;
      __syncthreads();  // the previous Q, dout tiles are consumed (and K, V are loaded)
      mma_load_tile<D>(qs, q + bh * Sq * D, i0, Sq, BQ);
      mma_load_tile<D>(dos, dout + bh * Sq * D, i0, Sq, BQ);
      for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
        const int64_t i = i0 + r;
        lse_s[r] = i < Sq ? lse[bh * Sq + i] * kLog2e : -INFINITY;
        delta_s[r] = i < Sq ? delta[bh * Sq + i] : 0.f;
        start_s[r] = key_begin(starts, i, Sq);
      }
      __syncthreads();
      // Sᵀ [16 × BQ] = K [16 × D] · Qᵀ and dPᵀ [16 × BQ] = V [16 × D] · doutᵀ
      float st[NT][4] = {}, dpt[NT][4] = {};
      mma_pair_nk<D>(st, dpt, ks, qs, vs, dos, LD, warp * 16, g, t);
      // Pᵀ and dSᵀ (element (key, query))
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = nt * 8 + 2 * t + (e & 1);
          const int64_t kj = key[e >> 1];
          const float L = lse_s[qi];
          const bool visible =
              kj < Skv && kj < key_end(i0 + qi, Sq, Skv, causal) && kj >= start_s[qi] && L != -INFINITY;
          const float p = visible ? exp2f(st[nt][e] * scale_log2 - L) : 0.f;
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - delta_s[qi]);
        }
        // dv [16 × D] += Pᵀ [16 × BQ] · dout [BQ × D];  dk [16 × D] += dSᵀ · q
#pragma unroll
      for (int kc = 0; kc < BQ / 16; ++kc) {
        uint32_t ap[4], ads[4];
        acc_to_a<NT>(ap, st, kc);
        acc_to_a<NT>(ads, dpt, kc);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          uint32_t bo[2], bq[2];
          frag_b_kn(bo, dos, LD, kc * 16, dt * 8, g, t);
          frag_b_kn(bq, qs, LD, kc * 16, dt * 8, g, t);
          mma_bf16(dv_acc[dt], ap, bo);
          mma_bf16(dk_acc[dt], ads, bq);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= Skv) continue;
    bf16* dkrow = dk + (bkv * Skv + key[r]) * D;
    bf16* dvrow = dv + (bkv * Skv + key[r]) * D;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      *reinterpret_cast<uint32_t*>(dkrow + dt * 8 + 2 * t) =
          pack_bf16(dk_acc[dt][2 * r] * scale, dk_acc[dt][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dvrow + dt * 8 + 2 * t) = pack_bf16(dv_acc[dt][2 * r], dv_acc[dt][2 * r + 1]);
    }
  }
}

// dq. grid (ceil(Sq / 64), B·N), block 128: warp w owns query rows blockIdx·64 + 16w + [0, 16).
// Dynamic shared memory: Q, dout, K, V [64][D + 8] bf16.
template <int D>
__global__ void __launch_bounds__(kMmaWarps* kWarp)
    sdpa_backward_q_mma_kernel(const bf16* q, const bf16* k, const bf16* v, const float* lse, const float* delta,
                               const bf16* dout, bf16* dq, int N, int Nkv, int64_t Sq, int64_t Skv, float scale,
                               bool causal, const int64_t* doc_start) {
  constexpr int LD = D + 8, NT = kMmaKeys / 8, DT = D / 8;
  bf16* qs = reinterpret_cast<bf16*>(attention_smem);  // [64][LD]
  bf16* dos = qs + kMmaRows * LD;                      // [64][LD]
  bf16* ks = dos + kMmaRows * LD;                      // [64][LD]
  bf16* vs = ks + kMmaKeys * LD;                       // [64][LD]
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int64_t qb = gridDim.x - 1 - blockIdx.x;
  const int64_t bh = blockIdx.y, b = bh / N, hk = (bh % N) / (N / Nkv);
  const int64_t q0 = qb * kMmaRows;
  const float scale_log2 = scale * kLog2e;
  const bf16* kp = k + (b * Nkv + hk) * Skv * D;
  const bf16* vp = v + (b * Nkv + hk) * Skv * D;
  mma_load_tile<D>(qs, q + bh * Sq * D, q0, Sq, kMmaRows);
  mma_load_tile<D>(dos, dout + bh * Sq * D, q0, Sq, kMmaRows);
  const int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int64_t* starts = doc_start == nullptr ? nullptr : doc_start + b * Sq;  // [Sq] of batch b
  float L[2], dl[2];
  int64_t row_end[2], row_begin[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    L[r] = row[r] < Sq ? lse[bh * Sq + row[r]] * kLog2e : -INFINITY;
    dl[r] = row[r] < Sq ? delta[bh * Sq + row[r]] : 0.f;
    row_end[r] = L[r] == -INFINITY ? 0 : key_end(row[r], Sq, Skv, causal);
    row_begin[r] = key_begin(starts, row[r], Sq);
  }
  const int64_t kend = key_end(min64(Sq, q0 + kMmaRows) - 1, Sq, Skv, causal);
  float dq_acc[DT][4] = {};
  for (int64_t j0 = warp_key_begin(starts, q0, kMmaRows, Sq, lane); j0 < kend; j0 += kMmaKeys) {
    __syncthreads();
    mma_load_tile<D>(ks, kp, j0, Skv, kMmaKeys);
    mma_load_tile<D>(vs, vp, j0, Skv, kMmaKeys);
    __syncthreads();
    // S [16 × 64] = Q · Kᵀ and dP [16 × 64] = dout · Vᵀ
    float s[NT][4] = {}, dp[NT][4] = {};
    mma_pair_nk<D>(s, dp, qs, ks, dos, vs, LD, warp * 16, g, t);
    // dS = P ∘ (dP - Δ), into s
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t kj = j0 + nt * 8 + 2 * t + (e & 1);
        const float p = kj < row_end[r] && kj >= row_begin[r] ? exp2f(s[nt][e] * scale_log2 - L[r]) : 0.f;
        s[nt][e] = p * (dp[nt][e] - dl[r]);
      }
      // dq [16 × D] += dS [16 × 64] · K [64 × D]
#pragma unroll
    for (int kc = 0; kc < kMmaKeys / 16; ++kc) {
      uint32_t a[4];
      acc_to_a<NT>(a, s, kc);
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        uint32_t bb[2];
        frag_b_kn(bb, ks, LD, kc * 16, dt * 8, g, t);
        mma_bf16(dq_acc[dt], a, bb);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= Sq) continue;
    bf16* dqrow = dq + (bh * Sq + row[r]) * D;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(dqrow + dt * 8 + 2 * t) =
          pack_bf16(dq_acc[dt][2 * r] * scale, dq_acc[dt][2 * r + 1] * scale);
  }
}

}  // namespace

// ==== launchers =================================================================================

namespace {

// ---- dispatch helpers ----

void check_sizes(const char* what, int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D) {
  AUTOSP_ASSERT(B >= 0 && Sq >= 0 && Skv >= 0 && D > 0, what, " sizes B ", B, " Sq ", Sq, " Skv ", Skv, " D ", D);
  AUTOSP_ASSERT(Nkv > 0 && N > 0 && N % Nkv == 0, what, " heads N ", N, " Nkv ", Nkv);
  AUTOSP_ASSERT(D <= 128, what, " head dim ", D, " > 128 is not supported on CUDA");
  AUTOSP_ASSERT(B * N <= 65535 && B * Nkv <= 65535, what, " B·N ", B * N, " exceeds the grid");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether the tensor-core kernels run on the current device.
bool mma_capable() {
  int dev = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 8;
}

template <class T>
bool use_mma(SdpaKernel kernel, int64_t D, std::initializer_list<const void*> ptrs) {
  if constexpr (!std::is_same_v<T, bf16>) {
    return false;
  } else {
    if (kernel == SdpaKernel::simt || (D != 64 && D != 128)) return false;
    for (const void* p : ptrs)
      if (!aligned16(p)) return false;
    return mma_capable();
  }
}

template <class Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

unsigned blocks(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

template <class T, int DPL>
void forward_simt(const T* q, const T* k, const T* v, T* o, float* lse, int64_t B, int64_t N, int64_t Nkv, int64_t Sq,
                  int64_t Skv, int64_t D, float scale, bool causal, const int64_t* docs, float softcap,
                  const float* sinks, cudaStream_t stream) {
  launch_kernel(sdpa_forward_simt_kernel<T, DPL>, dim3(blocks(Sq, kSimtWarps), unsigned(B * N)), kSimtWarps * kWarp, 0,
                stream, q, k, v, o, lse, int(N), int(Nkv), Sq, Skv, int(D), scale, causal, docs, softcap, sinks);
}

template <class T, int DPL>
void backward_simt(const T* q, const T* k, const T* v, const float* lse, const float* delta, const T* dout, T* dq,
                   T* dk, T* dv, int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, float scale,
                   bool causal, const int64_t* docs, float softcap, cudaStream_t stream) {
  if (Skv > 0) {
    launch_kernel(sdpa_backward_kv_simt_kernel<T, DPL>, dim3(blocks(Skv, kSimtWarps), unsigned(B * Nkv)),
                  kSimtWarps * kWarp, 0, stream, q, k, v, lse, delta, dout, dk, dv, int(N), int(Nkv), Sq, Skv, int(D),
                  scale, causal, docs, softcap);
  }
  if (Sq > 0) {
    launch_kernel(sdpa_backward_q_simt_kernel<T, DPL>, dim3(blocks(Sq, kSimtWarps), unsigned(B * N)),
                  kSimtWarps * kWarp, 0, stream, q, k, v, lse, delta, dout, dq, int(N), int(Nkv), Sq, Skv, int(D),
                  scale, causal, docs, softcap);
  }
}

template <int D>
void forward_mma(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, int64_t B, int64_t N, int64_t Nkv,
                 int64_t Sq, int64_t Skv, float scale, bool causal, const int64_t* docs, const float* sinks,
                 cudaStream_t stream) {
  const size_t smem = size_t(kMmaRows + 2 * kMmaKeys) * (D + 8) * sizeof(bf16);
  set_smem(sdpa_forward_mma_kernel<D>, smem);
  launch_kernel(sdpa_forward_mma_kernel<D>, dim3(blocks(Sq, kMmaRows), unsigned(B * N)), kMmaWarps * kWarp, smem,
                stream, q, k, v, o, lse, int(N), int(Nkv), Sq, Skv, scale * kLog2e, causal, docs, sinks);
}

template <int D>
void backward_mma(const bf16* q, const bf16* k, const bf16* v, const float* lse, const float* delta, const bf16* dout,
                  bf16* dq, bf16* dk, bf16* dv, int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, float scale,
                  bool causal, const int64_t* docs, cudaStream_t stream) {
  constexpr int BQ = kKvQueryTile<D>;
  if (Skv > 0) {
    const size_t smem =
        size_t(2 * kMmaRows + 2 * BQ) * (D + 8) * sizeof(bf16) + 2 * BQ * sizeof(float) + BQ * sizeof(int64_t);
    set_smem(sdpa_backward_kv_mma_kernel<D>, smem);
    launch_kernel(sdpa_backward_kv_mma_kernel<D>, dim3(blocks(Skv, kMmaRows), unsigned(B * Nkv)), kMmaWarps * kWarp,
                  smem, stream, q, k, v, lse, delta, dout, dk, dv, int(N), int(Nkv), Sq, Skv, scale, causal, docs);
  }
  if (Sq > 0) {
    const size_t smem = size_t(2 * kMmaRows + 2 * kMmaKeys) * (D + 8) * sizeof(bf16);
    set_smem(sdpa_backward_q_mma_kernel<D>, smem);
    launch_kernel(sdpa_backward_q_mma_kernel<D>, dim3(blocks(Sq, kMmaRows), unsigned(B * N)), kMmaWarps * kWarp, smem,
                  stream, q, k, v, lse, delta, dout, dq, int(N), int(Nkv), Sq, Skv, scale, causal, docs);
  }
}

}  // namespace

namespace {

// A window's per-row key starts [B, Sq]: max(doc_start[r], i + shift - window + 1), i = r % Sq.
__global__ void window_starts_kernel(const int64_t* docs, int64_t* out, int64_t total, int64_t Sq, int64_t shift,
                                     int64_t window) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= total) return;
  const int64_t first = r % Sq + shift - window + 1;
  out[r] = docs == nullptr ? first : max64(docs[r], first);
}

// The starts the kernels read for this call: the document starts, or the window's (in `buf`).
const int64_t* variant_starts(const char* what, const int64_t* docs, int64_t B, int64_t Sq, int64_t Skv, bool causal,
                              const AttentionVariant<float>& var, std::optional<Scratch>& buf, cudaStream_t stream) {
  AUTOSP_ASSERT(var.softcap >= 0, what, " softcap ", var.softcap);
  AUTOSP_ASSERT(var.window >= 0 && (var.offset == 0 || !causal), what, " window ", var.window, " offset ", var.offset,
                " causal ", causal);
  if (var.window == 0 || B * Sq == 0) return docs;
  buf.emplace(size_t(B * Sq) * sizeof(int64_t), stream);
  launch_kernel(window_starts_kernel, grid_for(B * Sq, 256), 256, 0, stream, docs, buf->as<int64_t>(), B * Sq, Sq,
                Skv - Sq + var.offset, var.window);
  return buf->as<int64_t>();
}

}  // namespace

template <class T>
void sdpa_forward(const T* q, const T* k, const T* v, T* o, float* lse, int64_t B, int64_t N, int64_t Nkv, int64_t Sq,
                  int64_t Skv, int64_t D, double scale, bool causal, cudaStream_t stream, SdpaKernel kernel,
                  const int64_t* doc_start, const AttentionVariant<float>& var) {
  check_sizes("sdpa", B, N, Nkv, Sq, Skv, D);
  if (B == 0 || Sq == 0) return;
  std::optional<Scratch> window_buf;
  const int64_t* docs = variant_starts("sdpa", doc_start, B, Sq, Skv, causal, var, window_buf, stream);
  const float sc = float(scale), cap = float(var.softcap);
  const float* sinks = var.sinks;
  if constexpr (std::is_same_v<T, bf16>) {
    if (var.softcap == 0 && use_mma<T>(kernel, D, {q, k, v, o})) {
      if (D == 64)
        forward_mma<64>(q, k, v, o, lse, B, N, Nkv, Sq, Skv, sc, causal, docs, sinks, stream);
      else
        forward_mma<128>(q, k, v, o, lse, B, N, Nkv, Sq, Skv, sc, causal, docs, sinks, stream);
      return;
    }
  }
  if (D <= 32)
    forward_simt<T, 1>(q, k, v, o, lse, B, N, Nkv, Sq, Skv, D, sc, causal, docs, cap, sinks, stream);
  else if (D <= 64)
    forward_simt<T, 2>(q, k, v, o, lse, B, N, Nkv, Sq, Skv, D, sc, causal, docs, cap, sinks, stream);
  else
    forward_simt<T, 4>(q, k, v, o, lse, B, N, Nkv, Sq, Skv, D, sc, causal, docs, cap, sinks, stream);
}

template <class T>
void sdpa_backward(const T* q, const T* k, const T* v, const T* o, const float* lse, const T* dout, T* dq, T* dk, T* dv,
                   int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal,
                   cudaStream_t stream, SdpaKernel kernel, const int64_t* doc_start, const AttentionVariant<float>& var) {
  check_sizes("sdpa_backward", B, N, Nkv, Sq, Skv, D);
  const int64_t rows = B * N * Sq;
  Scratch delta(size_t(rows) * sizeof(float), stream);  // Δ [B, N, Sq]
  if (rows > 0) {
    launch_kernel(sdpa_delta_kernel<T>, blocks(rows, 8), 8 * kWarp, 0, stream, o, dout, delta.as<float>(), rows,
                  int(D));
  }
  if (var.sinks != nullptr && var.dsinks != nullptr)  // written even when there are no rows (then 0)
    launch_kernel(sdpa_sinks_grad_kernel, dim3(unsigned(N)), 256, 0, stream, lse, delta.as<float>(), var.sinks,
                  var.dsinks, B, int(N), Sq);
  if (B == 0) return;
  std::optional<Scratch> window_buf;
  const int64_t* docs = variant_starts("sdpa_backward", doc_start, B, Sq, Skv, causal, var, window_buf, stream);
  const float sc = float(scale), cap = float(var.softcap);
  if constexpr (std::is_same_v<T, bf16>) {
    if (var.softcap == 0 && use_mma<T>(kernel, D, {q, k, v, dout, dq, dk, dv})) {
      if (D == 64)
        backward_mma<64>(q, k, v, lse, delta.as<float>(), dout, dq, dk, dv, B, N, Nkv, Sq, Skv, sc, causal, docs, stream);
      else
        backward_mma<128>(q, k, v, lse, delta.as<float>(), dout, dq, dk, dv, B, N, Nkv, Sq, Skv, sc, causal, docs, stream);
      return;
    }
  }
  if (D <= 32)
    backward_simt<T, 1>(q, k, v, lse, delta.as<float>(), dout, dq, dk, dv, B, N, Nkv, Sq, Skv, D, sc, causal, docs, cap,
                        stream);
  else if (D <= 64)
    backward_simt<T, 2>(q, k, v, lse, delta.as<float>(), dout, dq, dk, dv, B, N, Nkv, Sq, Skv, D, sc, causal, docs, cap,
                        stream);
  else
    backward_simt<T, 4>(q, k, v, lse, delta.as<float>(), dout, dq, dk, dv, B, N, Nkv, Sq, Skv, D, sc, causal, docs, cap,
                        stream);
}

namespace {

template <class T>
__global__ void merge_attention_kernel(float* o, float* lse, const T* o_blk, const float* lse_blk, int64_t rows,
                                       int64_t D) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float lb = lse_blk[r], la = lse[r];
  if (lb == -INFINITY) return;
  float* orow = o + r * D;
  const T* brow = o_blk + r * D;
  if (la == -INFINITY) {
    for (int64_t d = 0; d < D; ++d) orow[d] = load(brow, d);
    lse[r] = lb;
    return;
  }
  const float m = fmaxf(la, lb), wa = expf(la - m), wb = expf(lb - m), sum = wa + wb;
  for (int64_t d = 0; d < D; ++d) orow[d] = (orow[d] * wa + load(brow, d) * wb) / sum;
  lse[r] = m + logf(sum);
}

}  // namespace

template <class T>
void merge_attention(float* o, float* lse, const T* o_blk, const float* lse_blk, int64_t rows, int64_t D,
                     cudaStream_t stream) {
  AUTOSP_ASSERT(rows >= 0 && D > 0, "merge_attention rows ", rows, " D ", D);
  if (rows == 0) return;
  launch_kernel(merge_attention_kernel<T>, grid_for(rows, 256), 256, 0, stream, o, lse, o_blk, lse_blk, rows, D);
}

template <class T>
void causal_mask(const T* x, T* y, int64_t batch, int64_t Sq, int64_t Skv, T value, cudaStream_t stream) {
  AUTOSP_ASSERT(batch >= 0 && Sq >= 0 && Skv >= 0, "causal_mask sizes ", batch, " ", Sq, " ", Skv);
  const int64_t total = batch * Sq * Skv;
  if (total == 0) return;
  launch_kernel(causal_mask_kernel<T>, grid_for(total, 256), 256, 0, stream, x, y, total, Sq, Skv, value);
}

template void sdpa_forward<float>(const float*, const float*, const float*, float*, float*, int64_t, int64_t, int64_t,
                                  int64_t, int64_t, int64_t, double, bool, cudaStream_t, SdpaKernel, const int64_t*,
                                  const AttentionVariant<float>&);
template void sdpa_forward<bf16>(const bf16*, const bf16*, const bf16*, bf16*, float*, int64_t, int64_t, int64_t,
                                 int64_t, int64_t, int64_t, double, bool, cudaStream_t, SdpaKernel, const int64_t*,
                                  const AttentionVariant<float>&);
template void sdpa_backward<float>(const float*, const float*, const float*, const float*, const float*, const float*,
                                   float*, float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                                   bool, cudaStream_t, SdpaKernel, const int64_t*,
                                  const AttentionVariant<float>&);
template void sdpa_backward<bf16>(const bf16*, const bf16*, const bf16*, const bf16*, const float*, const bf16*, bf16*,
                                  bf16*, bf16*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool,
                                  cudaStream_t, SdpaKernel, const int64_t*,
                                  const AttentionVariant<float>&);
template void merge_attention<float>(float*, float*, const float*, const float*, int64_t, int64_t, cudaStream_t);
template void merge_attention<bf16>(float*, float*, const bf16*, const float*, int64_t, int64_t, cudaStream_t);
template void causal_mask<float>(const float*, float*, int64_t, int64_t, int64_t, float, cudaStream_t);
template void causal_mask<double>(const double*, double*, int64_t, int64_t, int64_t, double, cudaStream_t);
template void causal_mask<bf16>(const bf16*, bf16*, int64_t, int64_t, int64_t, bf16, cudaStream_t);

}  // namespace autosp::cuda
