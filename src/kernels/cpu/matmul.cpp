// CPU GEMM launchers: batched row-major GEMM, f32 on AVX-512 through our packed sgemm and
// everything else on OpenBLAS; bf16 GEMMs through the same packed driver on AMX tiles
// (amx_gemm.inc.h) or AVX512-BF16 (matmul_bf16.inc.h), else widened to f32, into an f32 C or a bf16
// one rounded by the last k-block (gemm_bf16_batched_rounded); and the thread count
// shared by OpenMP regions and OpenBLAS. Knows nothing of graphs or tensors.
//
// Packed sgemm (f32 where the CPU has AVX-512F; GotoBLAS/BLIS loop order). OpenBLAS is held to its
// 8-lane AVX2 kernels in this environment (OPENBLAS_CORETYPE=Haswell), and its AVX-512 kernels are
// not in every build; this one is ~2× faster here on the model's linear layers (docs/performance.md).
//   for jc over N in kNC columns:            B block  [kc, nc]  (the micro-panels a thread reads)
//     for pc over K in kKC:                  (k-blocks after the first accumulate: beta = 1;
//                                             AMX's blocks are deeper: kDepth, kBlockRows)
//       pack B[pc, jc] into kNR-column micro-panels [kc][kNR], zero-padded       (each thread its own)
//       for ic over this thread's rows in kMC: pack A[ic, pc] into kMR-row micro-panels [kc][kMR]
//         for jr over the B micro-panels:    one panel (kc · kNR · 4 B = 32 KiB) stays in L1
//                                            (f32: the next panel's C lines prefetched into L2)
//           for ir over the A micro-panels:  vec16::micro_tile<kMR, kNR / 16> into C (a full tile),
//                                            or into a scratch tile copied out at the M, N edges
// Threads split C by rows (kMR-panel boundaries), or by B micro-panels when M is too small to
// split; each thread writes only its own C rows or columns and packs its own A block and its own
// copy of the B micro-panels it reads (thread-local scratch), so the threads share nothing and
// never wait for each other inside the call: no barrier but the region's end. Splitting by rows,
// every thread packs the whole B block (K·N copies against the (M/threads)·N·K multiply-adds it
// then does: under 1% at the model's shapes); a shared B block needed two barriers per kKC step,
// and at each one a thread that the OS had descheduled held the other (docs/performance.md).
//
// Threading of the rest: a large GEMM is one call per batch entry, threaded inside (ours or
// OpenBLAS's). A batch of mid-sized GEMMs (kMinBatchMNK ≤ M·N·K ≤ kSmallMNK) is spread over the
// batch with OpenMP instead: at that size OpenBLAS 0.3.x runs single-threaded in the calling thread
// (its interface/gemm.c threshold is 65536 · GEMM_MULTITHREAD_THRESHOLD = 65536 · 4) and concurrent
// calls are safe. Tiny GEMMs stay sequential: per-call overhead and OpenBLAS's shared buffer pool
// make them slower when issued from several threads at once.
//
// The build links OpenBLAS's OpenMP variant (libopenblas-openmp-dev) so that BLAS and our kernels
// share one thread pool: the pthread build keeps a second pool spinning beside OpenMP's, and on a
// machine with few cores an OpenMP kernel right after a threaded GEMM ran 1.5–3× slower.
#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <string>
#include <type_traits>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/dp16.h"
#include "kernels/cpu/vec16.h"
#include "tensor/check.h"
#include "tensor/convert.h"

namespace autosp::cpu {

namespace {

constexpr double kSmallMNK = 65536.0 * 4.0;  // largest GEMM OpenBLAS keeps single-threaded
constexpr double kMinBatchMNK = 16384.0;     // smallest GEMM worth a thread of its own
constexpr double kMinPackedMNK = 4096.0;     // smaller f32 GEMMs stay on OpenBLAS (packing would dominate)

// ---- packed sgemm ----

constexpr int64_t kMR = 14, kNR = 32;  // micro tile: 14 × 2 zmm accumulators, 2 for B, 2 spare
constexpr int64_t kKC = 256;           // B micro-panel kKC × kNR floats = 32 KiB (L1: 32 KiB Zen 4, 48 Zen 5)
constexpr int64_t kMC = 24 * kMR;      // A block kMC × kKC floats = 336 KiB (L2 is 1 MiB)
constexpr int64_t kNC = 2048;          // B block kKC × kNC floats = 2 MiB, shared
static_assert(kNR % 16 == 0 && kNC % kNR == 0 && kMC % kMR == 0);

// Grow-only 64-byte-aligned scratch, one per thread and role.
class Scratch {
 public:
  ~Scratch() { std::free(p_); }
  float* get(int64_t n) {
    if (n > n_) {
      std::free(p_);
      p_ = static_cast<float*>(std::aligned_alloc(64, size_t((n + 15) / 16 * 16) * sizeof(float)));
      AUTOSP_ASSERT(p_ != nullptr, "sgemm scratch of ", n, " floats");
      n_ = n;
    }
    return p_;
  }

 private:
  float* p_ = nullptr;
  int64_t n_ = 0;
};

// Row-major op(A) [M, K] and op(B) [K, N] of one GEMM, stored as E.
template <class E>
struct GemmOperands {
  bool ta, tb;
  const E* a;
  int64_t lda;
  const E* b;
  int64_t ldb;
};
using Operands = GemmOperands<float>;

// The A block at (i0, p0): op(A)[i0 + q·kMR + r][p0 + k] → ap[q·kc·kMR + k·kMR + r] for the mc
// rows of the block, 0 in the rows of its last micro-panel past mc. Stored [M, K], 16 × 16 blocks
// (kMR rows and two of zeros, by 16 k) are transposed in registers: each source cache line is read
// once and used whole, where reading kMR rows side by side a float at a time missed L1 at K = 1024
// (rows 4 KiB apart share one L1 set; 17% of the GEMM). Stored [K, M], each k's kMR values are
// side by side: 16 rows k at a time are copied micro-panel by micro-panel, so that the stores run
// through one panel at a time (a whole row k across the block's panels wrote 24 panels 14 KiB
// apart, two L1 sets, at once: pack_a was 14% of the 1024 × 256 × 1024 weight gradient, now 7%).
__attribute__((target("avx512f"))) void pack_a(const Operands& o, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                                               float* ap) {
  constexpr __mmask16 kPanel = (1u << kMR) - 1;
  if (o.ta) {
    constexpr int64_t kRun = 16;  // k per sweep
    for (int64_t k0 = 0; k0 < kc; k0 += kRun)
      for (int64_t q = 0; q * kMR < mc; ++q) {
        const __mmask16 rows = __mmask16((1u << std::min(kMR, mc - q * kMR)) - 1);
        const float* src = o.a + p0 * o.lda + i0 + q * kMR;
        float* dst = ap + q * kc * kMR;
        for (int64_t k = k0; k < std::min(kc, k0 + kRun); ++k)
          _mm512_mask_storeu_ps(dst + k * kMR, kPanel, _mm512_maskz_loadu_ps(rows, src + k * o.lda));
      }
    return;
  }
  for (int64_t q = 0; q * kMR < mc; ++q) {
    float* dst = ap + q * kc * kMR;
    const int64_t rows = std::min(kMR, mc - q * kMR), i = i0 + q * kMR;
    const float* src[kMR];
    for (int64_t r = 0; r < kMR; ++r) src[r] = o.a + (i + std::min(r, rows - 1)) * o.lda + p0;
    int64_t k = 0;
    for (; k + 16 <= kc; k += 16) {
      vec16::f32x16 v[16];
#pragma GCC unroll 16
      for (int64_t r = 0; r < 16; ++r) v[r] = r < rows ? vec16::load(src[r] + k) : vec16::splat(0.0f);
      vec16::transpose16(v);
#pragma GCC unroll 16
      for (int64_t t = 0; t < 16; ++t) _mm512_mask_storeu_ps(dst + (k + t) * kMR, kPanel, __m512(v[t]));
    }
    for (; k < kc; ++k)
      for (int64_t r = 0; r < kMR; ++r) dst[k * kMR + r] = r < rows ? src[r][k] : 0.0f;
  }
}

// Micro-panels [q0, q1) of the B block at (p0, j0) of width nc: op(B)[p0 + k][j0 + q·kNR + j] →
// bp[q·kc·kNR + k·kNR + j], 0 past the block's last column. Stored [K, N], 8 rows k at a time are
// read across the thread's panels, panel by panel: 8 sequential streams, and each panel's stores
// are 1 KiB in a row (the panel-at-a-time order over all kc rows read 128 bytes from each of kc
// rows ldb apart: a new page per row once ldb ≥ 1024 floats, which the prefetcher does not follow;
// a whole row at a time stored into every panel at once, 32 KiB apart, all in the same L1 sets).
// Stored [N, K], each column is consecutive over k: 16 columns by 16 k are transposed in
// registers (a float at a time, kNR apart, every store missed L1: the panel is L1's size).
__attribute__((target("avx512f"))) void pack_b(const Operands& o, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                                               int64_t q0, int64_t q1, float* bp) {
  if (o.tb) {
    for (int64_t q = q0; q < q1; ++q) {
      float* dst = bp + q * kc * kNR;
      const int64_t cols = std::min(kNR, nc - q * kNR);
      for (int64_t c0 = 0; c0 < kNR; c0 += 16) {
        const auto column = [&](int64_t c) { return o.b + (j0 + q * kNR + c) * o.ldb + p0; };
        int64_t k = 0;
        for (; k + 16 <= kc; k += 16) {
          vec16::f32x16 v[16];
#pragma GCC unroll 16
          for (int64_t c = 0; c < 16; ++c) v[c] = c0 + c < cols ? vec16::load(column(c0 + c) + k) : vec16::splat(0.0f);
          vec16::transpose16(v);
#pragma GCC unroll 16
          for (int64_t t = 0; t < 16; ++t) vec16::store(dst + (k + t) * kNR + c0, v[t]);
        }
        for (; k < kc; ++k)
          for (int64_t c = c0; c < c0 + 16; ++c) dst[k * kNR + c] = c < cols ? column(c)[k] : 0.0f;
      }
    }
    return;
  }
  constexpr int64_t kRun = 8;  // rows per sweep
  for (int64_t k0 = 0; k0 < kc; k0 += kRun)
    for (int64_t q = q0; q < q1; ++q)
      for (int64_t k = k0; k < std::min(kc, k0 + kRun); ++k) {
        const float* src = o.b + (p0 + k) * o.ldb + j0;
        float* dst = bp + q * kc * kNR + k * kNR;
        const int64_t cols = std::min(kNR, nc - q * kNR);
        if (cols == kNR) {
#pragma GCC unroll 4
          for (int64_t v = 0; v < kNR / 16; ++v) vec16::store(dst + 16 * v, vec16::load(src + q * kNR + 16 * v));
          continue;
        }
        for (int64_t c = 0; c < cols; ++c) dst[c] = src[q * kNR + c];
        for (int64_t c = cols; c < kNR; ++c) dst[c] = 0.0f;
      }
}

// 16 floats rounded to bf16, to nearest even, NaN kept a quiet NaN: tensor/convert.h's
// f32_to_bf16, lane by lane (the same bits). round_block's rows could call convert.h's cast
// instead; that measured 8–9 ms slower over the Llama-768 shapes' 84–88 ms (one thread, three
// alternated rounds), so the rounding stays here, with one 64-byte store per 32 outputs. (The maskz forms with every lane on: GCC 12's plain
// shift and narrowing intrinsics start from an "undefined" vector that -Wmaybe-uninitialized flags.)
__attribute__((target("avx512f"))) [[gnu::always_inline]] inline __m256i round_bf16(__m512 v) {
  constexpr __mmask16 kAll = 0xffff;
  const __m512i x = _mm512_castps_si512(v), hi = _mm512_maskz_srli_epi32(kAll, x, 16);
  const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i sum = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i bits = _mm512_mask_mov_epi32(_mm512_maskz_srli_epi32(kAll, sum, 16), nan,
                                             _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_maskz_cvtepi32_epi16(kAll, bits);
}

// Out tile [rows, cols] (ldo) = alpha · tile + beta · C (ldc) from a scratch tile of kNR columns (an
// edge tile); Out may be C. The same operations per element as a scalar alpha · t + beta · c.
__attribute__((target("avx512f"))) void edge_out(const float* tile, float alpha, float beta, const float* c,
                                                 int64_t ldc, int64_t rows, int64_t cols, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 m = __mmask16((1u << std::min<int64_t>(16, cols - j)) - 1);
      __m512 v = _mm512_mul_ps(_mm512_set1_ps(alpha), _mm512_maskz_loadu_ps(m, tile + r * kNR + j));
      if (beta != 0.0f) v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, c + r * ldc + j)));
      _mm512_mask_storeu_ps(out + r * ldo + j, m, v);
    }
}

// The kernels' contract, on packed panels of depth kc: Out tile [rows ≤ mr, cols ≤ kNR] (ldo) =
// alpha · Ap · Bp + beta · C tile (ldc); Out is C itself but where a bf16 C is being written
// (gemm_thread's f32 block). beta == 0 never reads C.
__attribute__((target("avx512f"))) void kernel(const Operands&, int64_t kc, float alpha, const float* ap,
                                               const float* bp, float beta, const float* c, int64_t ldc, int64_t rows,
                                               int64_t cols, float* out, int64_t ldo) {
  if (rows == kMR && cols == kNR && out == c)
    return vec16::micro_tile<kMR, kNR / 16>(kc, alpha, ap, 1, kMR, bp, kNR, beta, out, ldo);
  // An edge tile: into a scratch tile, computing only the rows it has (4, 8 or all kMR): the last
  // panel of M = 256 has 4 rows, and a full 14-row product there wasted 4% of the weight gradients.
  alignas(64) float tile[kMR * kNR];
  if (rows <= 4) vec16::micro_tile<4, kNR / 16>(kc, 1.0f, ap, 1, kMR, bp, kNR, 0.0f, tile, kNR);
  else if (rows <= 8) vec16::micro_tile<8, kNR / 16>(kc, 1.0f, ap, 1, kMR, bp, kNR, 0.0f, tile, kNR);
  else vec16::micro_tile<kMR, kNR / 16>(kc, 1.0f, ap, 1, kMR, bp, kNR, 0.0f, tile, kNR);
  edge_out(tile, alpha, beta, c, ldc, rows, cols, out, ldo);
}

// The C tile [rows, cols] (ldc) at c prefetched into L2, while the kernel computes the tile beside
// it: a tile's stores (or, after the first k-block, its loads) missed every cache, and the model's
// GEMMs ran 7–16% slower on a C fresh from memory than on one in cache (decision 281). Always
// inlined: GCC takes a function whose only effect is __builtin_prefetch for one without effects,
// and drops its calls.
[[gnu::always_inline]] inline void prefetch_c(const float* c, int64_t ldc, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t x = 0; x < cols; x += 16) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + x), _MM_HINT_T1);
}

// y [rows, cols] (ldy) = the f32 block [rows, cols] (lds) rounded to bf16, a row at a time.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void round_block(const float* block, int64_t lds, int64_t rows,
                                                                     int64_t cols, uint16_t* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t j = 0;
    for (; j + 32 <= cols; j += 32) {  // 64 bytes of y at a time
      const __m512i lo = _mm512_castsi256_si512(round_bf16(_mm512_loadu_ps(block + r * lds + j)));
      _mm512_storeu_si512(y + r * ldy + j, _mm512_maskz_inserti64x4(0xff, lo, round_bf16(_mm512_loadu_ps(block + r * lds + j + 16)), 1));
    }
    for (; j < cols; j += 16) {
      const __mmask16 m = __mmask16((1u << std::min<int64_t>(16, cols - j)) - 1);
      _mm256_mask_storeu_epi16(y + r * ldy + j, m, round_bf16(_mm512_maskz_loadu_ps(m, block + r * lds + j)));
    }
  }
}

// The rows of an A micro-panel (the kernel's tile) for operands O; AMX's differ (amx_gemm.inc.h).
template <class O>
constexpr int64_t kPanelRows = kMR;

// The most pairs (f32: floats) of a k-block and the rows of an A block for operands O; AMX's
// differ (amx_gemm.inc.h).
template <class O>
constexpr int64_t kDepth = kKC;
template <class O>
constexpr int64_t kBlockRows = kMC;

// Whatever a thread holds while its kernel runs, for operands O: nothing but on AMX (its tiles).
template <class O>
int use_tiles(const O&) {
  return 0;
}

#include "kernels/cpu/matmul_bf16.inc.h"  // the bf16 operands' packing and tiles (Bf16Operands)
#include "kernels/cpu/amx_gemm.inc.h"     // the same on AMX tiles (AmxOperands)

// This thread's part of C [M, N] (ldc) = alpha · op(A) · op(B) + beta · C, with `threads` threads
// of the enclosing region (1 outside one) running the same call. O is Operands (f32; K in floats),
// Bf16Operands or AmxOperands (K in bf16 pairs, the packed depth): the packers and the tile kernel
// are overloaded on it (and the micro-panel rows, kPanelRows), the loops are one.
// With y, the last k-block's sums go to y (ldc) rounded to bf16 instead of to C, and C holds
// only the earlier k-blocks' sums (null where K is one block and beta = 0): the last block's
// tiles of an A block go to a thread-local f32 block [mc, this thread's columns of nc], rounded
// into y row by row once the block is whole, so that y is written in runs of whole rows (a
// 32-column strip at a time wrote y 64 bytes a row, 4–23% of the GEMM's time; decision 240).
template <class O>
void gemm_thread(const O& o, int64_t M, int64_t N, int64_t K, float alpha, float beta, float* c,
                  int64_t ldc, uint16_t* y, int thread, int threads) {
  constexpr int64_t mr = kPanelRows<O>, mc_max = kBlockRows<O> / mr * mr, kc_max = kDepth<O>;
  [[maybe_unused]] const auto tiles = use_tiles(o);
  static thread_local Scratch a_scratch, b_scratch;
  float* ap = a_scratch.get(mc_max * kc_max);
  float* bp = b_scratch.get(std::min(kc_max, K) * ((std::min(kNC, N) + kNR - 1) / kNR * kNR));
  static thread_local Scratch block_scratch;
  float* block = y ? block_scratch.get(mc_max * kNC) : nullptr;  // [mc, nc] (ld kNC) of the last k-block
  // Split by rows when every thread gets at least two micro-panels of them, else by B micro-panels;
  // of the two, the one whose busiest thread has fewer micro-tiles (rows on a tie): at M = 256,
  // 19 row panels split 9 / 10 between two threads, while 24 column panels split 12 / 12.
  const int64_t row_panels = (M + mr - 1) / mr, col_panels = (N + kNR - 1) / kNR;
  const auto busiest = [threads](int64_t panels) { return (panels + threads - 1) / threads; };
  const bool by_rows =
      row_panels >= 2 * threads && busiest(row_panels) * col_panels <= row_panels * busiest(col_panels);
  const int64_t m0 = by_rows ? std::min(M, row_panels * thread / threads * mr) : 0;
  const int64_t m1 = by_rows ? std::min(M, row_panels * (thread + 1) / threads * mr) : M;
  for (int64_t jc = 0; jc < N; jc += kNC) {
    const int64_t nc = std::min(kNC, N - jc), panels = (nc + kNR - 1) / kNR;
    const int64_t q0 = by_rows ? 0 : panels * thread / threads, q1 = by_rows ? panels : panels * (thread + 1) / threads;
    for (int64_t pc = 0; pc < K; pc += kc_max) {
      const int64_t kc = std::min(kc_max, K - pc);
      const float beta_pc = pc == 0 ? beta : 1.0f;
      uint16_t* y_pc = pc + kc >= K ? y : nullptr;
      pack_b(o, pc, kc, jc, nc, q0, q1, bp);  // the panels this thread reads
      for (int64_t ic = m0; ic < m1; ic += mc_max) {
        const int64_t mc = std::min(mc_max, m1 - ic);
        pack_a(o, ic, mc, pc, kc, ap);
        for (int64_t q = q0; q < q1; ++q) {
          const int64_t j = jc + q * kNR, cols = std::min(kNR, N - j);
          for (int64_t ir = 0; ir < mc; ir += mr) {
            const int64_t at = (ic + ir) * ldc + j;
            if constexpr (std::is_same_v<O, Operands>)  // f32: these rows of the next micro-panel's C
              if (!y_pc && q + 1 < q1 && j + kNR < N)
                prefetch_c(c + at + kNR, ldc, std::min(mr, mc - ir), std::min(kNR, N - j - kNR));
            kernel(o, kc, alpha, ap + ir * kc, bp + q * kc * kNR, beta_pc, c ? c + at : nullptr, ldc,
                   std::min(mr, mc - ir), cols, y_pc ? block + ir * kNC + (q - q0) * kNR : c + at, y_pc ? kNC : ldc);
          }
        }
        if (y_pc) {  // this thread's columns of the block, row by row
          const int64_t j0 = jc + q0 * kNR, cols = std::min(N, jc + q1 * kNR) - j0;
          round_block(block, kNC, mc, cols, y_pc + ic * ldc + j0, ldc);
        }
      }
    }
  }
}

// One GEMM on `threads` threads (in the calling thread alone inside a parallel region).
template <class O>
void run_threads(const O& o, int64_t M, int64_t N, int64_t K, float alpha, float beta, float* c, int64_t ldc,
                 int threads, uint16_t* y = nullptr) {
  if (threads == 1 || omp_in_parallel()) return gemm_thread(o, M, N, K, alpha, beta, c, ldc, y, 0, 1);
#pragma omp parallel num_threads(threads)
  gemm_thread(o, M, N, K, alpha, beta, c, ldc, y, omp_get_thread_num(), omp_get_num_threads());
}

// one(p, threads) for each batch entry p: spread over the batch, one thread each (`over_batch`),
// else one after another, each on `threads` threads. Not `parallel for if (over_batch)`: an
// inactive region around a threaded call would make its region a nested team (new threads, while
// the outer pool's idle threads spin).
template <class F>
void for_batch(bool over_batch, int64_t batch, int threads, const F& one) {
  if (over_batch) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < batch; ++p) one(p, 1);
  } else {
    for (int64_t p = 0; p < batch; ++p) one(p, threads);
  }
}

// Whether a batch of GEMMs of M·N·K = mnk is spread over the batch (mid-sized ones; stride_c == 0
// accumulates into one C in batch order, so it must stay sequential), and else how many threads
// one call takes.
bool spread_over_batch(int64_t batch, double mnk, int64_t stride_c) {
  return batch > 1 && stride_c != 0 && mnk >= kMinBatchMNK && mnk <= kSmallMNK && !omp_in_parallel();
}
int threads_inside(double mnk) { return mnk <= kSmallMNK || omp_in_parallel() ? 1 : omp_get_max_threads(); }

// One bf16 GEMM (K > 0) on `path`'s packed kernel (amx, amx_emulated or avx512_bf16), depth in pairs;
// with y, rounded into y (run_threads).
void run_bf16(Bf16Gemm path, const Bf16Operands& o, int64_t M, int64_t N, float alpha, float beta, float* c,
              int64_t ldc, int threads, uint16_t* y = nullptr) {
  const int64_t pairs = (o.K + 1) / 2;
  if (path == Bf16Gemm::amx)
    return run_threads(AmxOperands<amx::HwTiles>{o}, M, N, pairs, alpha, beta, c, ldc, threads, y);
  if (path == Bf16Gemm::amx_emulated)
    return run_threads(AmxOperands<amx::EmulatedTiles>{o}, M, N, pairs, alpha, beta, c, ldc, threads, y);
  run_threads(o, M, N, pairs, alpha, beta, c, ldc, threads, y);
}

// Whether a bf16 GEMM of depth K on `path` runs in one k-block (so a bf16 C needs no f32 sums).
bool one_k_block(Bf16Gemm path, int64_t K) {
  const int64_t pairs = (K + 1) / 2;
  if (path == Bf16Gemm::amx || path == Bf16Gemm::amx_emulated) return pairs <= kDepth<AmxOperands<amx::HwTiles>>;
  return path != Bf16Gemm::f32 && pairs <= kDepth<Bf16Operands>;
}

}  // namespace

bool packed_sgemm_available() { return vec16::has_avx512f(); }

void packed_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads) {
  AUTOSP_ASSERT(packed_sgemm_available(), "packed_sgemm needs AVX-512F");
  AUTOSP_ASSERT(M >= 0 && N >= 0 && K > 0 && threads >= 1, "packed_sgemm sizes ", M, " ", N, " ", K, " threads ",
                threads);
  if (M == 0 || N == 0) return;
  const Operands o{trans_a, trans_b, a, lda, b, ldb};
  run_threads(o, M, N, K, alpha, beta, c, ldc, threads);
}

namespace {

void gemm_one(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, float alpha,
              const float* a, blasint lda, const float* b, blasint ldb, float beta, float* c,
              blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_one(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, double alpha,
              const double* a, blasint lda, const double* b, blasint ldb, double beta, double* c,
              blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, T alpha,
                  const T* a, int64_t stride_a, const T* b, int64_t stride_b, T beta, T* c,
                  int64_t stride_c) {
  AUTOSP_ASSERT(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "gemm sizes ", batch, " ", M, " ", N, " ", K);
  AUTOSP_ASSERT(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX, "gemm dims exceed blasint");
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {  // C = beta · C (BLAS would reject lda = 0); beta == 0 overwrites NaN too
    for (int64_t p = 0; p < batch; ++p) {
      T* cp = c + p * stride_c;
      for (int64_t i = 0; i < M * N; ++i) cp[i] = beta == T(0) ? T(0) : beta * cp[i];
    }
    return;
  }
  // A[b]: M×K (lda K) or stored K×M (lda M); B[b]: K×N (ldb N) or stored N×K (ldb K); C[b]: M×N.
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const blasint lda = blasint(trans_a ? M : K), ldb = blasint(trans_b ? K : N), ldc = blasint(N);
  const double mnk = double(M) * double(N) * double(K);
  const bool over_batch = spread_over_batch(batch, mnk, stride_c);
  if constexpr (std::is_same_v<T, float>) {
    if (packed_sgemm_available() && mnk >= kMinPackedMNK) {
      for_batch(over_batch, batch, threads_inside(mnk), [&](int64_t p, int threads) {
        packed_sgemm(trans_a, trans_b, M, N, K, alpha, a + p * stride_a, lda, b + p * stride_b, ldb, beta,
                     c + p * stride_c, ldc, threads);
      });
      return;
    }
  }
  // OpenBLAS threads a large call itself.
  for_batch(over_batch, batch, 1, [&](int64_t p, int) {
    gemm_one(ta, tb, blasint(M), blasint(N), blasint(K), alpha, a + p * stride_a, lda, b + p * stride_b, ldb, beta,
             c + p * stride_c, ldc);
  });
}

// ---- bf16 ----

bool bf16_gemm_available(Bf16Gemm path) {
  static const bool dp = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl");
  // The AMX path packs and writes edges with AVX-512 (every CPU with AMX has it).
  static const bool tiles = amx::amx_tiles_granted() && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl");
  switch (path) {
    case Bf16Gemm::amx: return tiles;
    case Bf16Gemm::avx512_bf16: return dp;
    case Bf16Gemm::f32: return true;
    case Bf16Gemm::amx_emulated: return amx_gemm_available(true);
  }
  return false;
}

// The best path at or below AUTOSP_BF16_GEMM's cap (matmul.h).
Bf16Gemm bf16_gemm_best() {
  const char* env = std::getenv("AUTOSP_BF16_GEMM");
  const std::string cap = env && *env ? env : "amx";  // set but empty: no cap, as unset
  const std::vector<Bf16Gemm> order = {Bf16Gemm::amx, Bf16Gemm::avx512_bf16};
  size_t first = 0;
  if (cap == "avx512_bf16") first = 1;
  else if (cap == "f32") first = order.size();
  else if (cap != "amx")
    throw UsageError(str("AUTOSP_BF16_GEMM=", cap, ": expected amx, avx512_bf16 or f32 (the best bf16 GEMM path to allow)"));
  for (size_t i = first; i < order.size(); ++i)
    if (bf16_gemm_available(order[i])) return order[i];
  return Bf16Gemm::f32;
}

const char* bf16_gemm_name(Bf16Gemm path) {
  switch (path) {
    case Bf16Gemm::amx: return "AMX (tdpbf16ps tiles, f32 accumulation)";
    case Bf16Gemm::avx512_bf16: return "AVX512-BF16 (vdpbf16ps, f32 accumulation)";
    case Bf16Gemm::amx_emulated: return "AMX kernel on emulated tiles (a test tool)";
    case Bf16Gemm::f32: break;
  }
  return "emulated (bf16 widened to f32)";
}

bool amx_gemm_available(bool emulated_tiles) {
  return emulated_tiles ? __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
                        : bf16_gemm_available(Bf16Gemm::amx);
}

void amx_gemm(bool emulated_tiles, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc,
              int threads) {
  AUTOSP_ASSERT(amx_gemm_available(emulated_tiles), "amx_gemm: this CPU lacks ",
                emulated_tiles ? "AVX-512BW/VL" : "AMX tiles");
  AUTOSP_ASSERT(M >= 0 && N >= 0 && K > 0 && threads >= 1, "amx_gemm sizes ", M, " ", N, " ", K, " threads ", threads);
  if (M == 0 || N == 0) return;
  run_bf16(emulated_tiles ? Bf16Gemm::amx_emulated : Bf16Gemm::amx, bf16_operands(trans_a, trans_b, a, lda, b, ldb, K),
           M, N, alpha, beta, c, ldc, threads);
}

void gemm_bf16_batched(Bf16Gemm path, bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                       float alpha, const uint16_t* a, int64_t stride_a, const uint16_t* b, int64_t stride_b,
                       float beta, float* c, int64_t stride_c) {
  AUTOSP_ASSERT(bf16_gemm_available(path), "bf16 GEMM path ", bf16_gemm_name(path), " is not available on this CPU");
  AUTOSP_ASSERT(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "gemm sizes ", batch, " ", M, " ", N, " ", K);
  if (batch == 0 || M == 0 || N == 0) return;
  if (path == Bf16Gemm::f32 || K == 0) {  // widened exactly; K = 0 is gemm_batched's C = beta · C
    auto widen = [&](const uint16_t* x, int64_t stride, int64_t n) {
      std::vector<float> w(size_t(stride == 0 ? n : (batch - 1) * stride + n));
#pragma omp parallel for schedule(static) if (w.size() > 65536)
      for (size_t i = 0; i < w.size(); ++i) w[i] = std::bit_cast<float>(uint32_t(x[i]) << 16);  // bf16 → f32: exact
      return w;
    };
    const std::vector<float> aw = widen(a, stride_a, M * K), bw = widen(b, stride_b, K * N);
    return gemm_batched<float>(trans_a, trans_b, batch, M, N, K, alpha, aw.data(), stride_a, bw.data(), stride_b, beta,
                               c, stride_c);
  }
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N, ldc = N;
  const double mnk = double(M) * double(N) * double(K);
  for_batch(spread_over_batch(batch, mnk, stride_c), batch, threads_inside(mnk), [&](int64_t p, int threads) {
    run_bf16(path, bf16_operands(trans_a, trans_b, a + p * stride_a, lda, b + p * stride_b, ldb, K), M, N, alpha, beta,
             c + p * stride_c, ldc, threads);
  });
}

int64_t gemm_bf16_partials(Bf16Gemm path, int64_t batch, int64_t M, int64_t N, int64_t K) {
  return K == 0 || one_k_block(path, K) ? 0 : batch * M * N;
}

void gemm_bf16_batched_rounded(Bf16Gemm path, bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N,
                               int64_t K, float alpha, const uint16_t* a, int64_t stride_a, const uint16_t* b,
                               int64_t stride_b, uint16_t* y, int64_t stride_y, float* partials) {
  AUTOSP_ASSERT(bf16_gemm_available(path), "bf16 GEMM path ", bf16_gemm_name(path), " is not available on this CPU");
  AUTOSP_ASSERT(batch >= 0 && M >= 0 && N >= 0 && K >= 0, "gemm sizes ", batch, " ", M, " ", N, " ", K);
  AUTOSP_ASSERT(stride_y != 0 || batch <= 1, "a bf16 C takes no accumulation over the batch (stride_y 0)");
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum
    for (int64_t p = 0; p < batch; ++p) std::memset(y + p * stride_y, 0, size_t(M * N) * sizeof(uint16_t));
    return;
  }
  const int64_t sums = gemm_bf16_partials(path, batch, M, N, K);
  AUTOSP_ASSERT(sums == 0 || partials != nullptr, "gemm_bf16_batched_rounded needs ", sums, " floats of partial sums");
  if (path == Bf16Gemm::f32) {  // widened: the whole f32 C, then rounded
    gemm_bf16_batched(path, trans_a, trans_b, batch, M, N, K, alpha, a, stride_a, b, stride_b, 0.0f, partials, M * N);
    for (int64_t p = 0; p < batch; ++p) cast<float, uint16_t>(partials + p * M * N, y + p * stride_y, M * N);
    return;
  }
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  const double mnk = double(M) * double(N) * double(K);
  for_batch(spread_over_batch(batch, mnk, stride_y), batch, threads_inside(mnk), [&](int64_t p, int threads) {
    run_bf16(path, bf16_operands(trans_a, trans_b, a + p * stride_a, lda, b + p * stride_b, ldb, K), M, N, alpha, 0.0f,
             sums > 0 ? partials + p * M * N : nullptr, N, threads, y + p * stride_y);
  });
}

void set_num_threads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

template void gemm_batched<float>(bool, bool, int64_t, int64_t, int64_t, int64_t, float, const float*,
                                  int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm_batched<double>(bool, bool, int64_t, int64_t, int64_t, int64_t, double,
                                   const double*, int64_t, const double*, int64_t, double, double*,
                                   int64_t);

}  // namespace autosp::cpu
