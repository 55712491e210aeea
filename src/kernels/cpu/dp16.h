// The AVX512-BF16 building blocks shared by the packed bf16 GEMM (matmul_bf16.inc.h) and the
// attention's bf16 tile products (attention_bf16.inc.h): the vdpbf16ps register tile and the
// interleaving of two bf16 rows into 32-bit pair words. Knows nothing of graphs, tensors or threads.
//
// vdpbf16ps multiplies the two bf16 halves of each 32-bit lane of its sources (exactly: a product
// of two bf16 fits f32) and adds both products into the lane's f32 accumulator (bf16 denormal
// inputs read as 0, like the AMX and cuBLAS bf16 paths). So a GEMM's depth runs in pairs: an
// operand element is one 32-bit word (X[i][2p] in the low half, X[i][2p + 1] in the high half).
// Everything here is always inlined into functions compiled with (at least) the same target.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace autosp::cpu::dp16 {

// The 32-bit word at element i of x (memcpy: x may point at floats or bf16 halves).
[[gnu::always_inline]] inline uint32_t word(const void* x, int64_t i) {
  uint32_t w;
  std::memcpy(&w, static_cast<const char*>(x) + 4 * i, sizeof w);
  return w;
}

// vec16::micro_tile's contract on pair words: C[r][0, 16·V) = alpha · Σ_k A[r][k] · B[k] + beta · C
// for R rows over K pairs, A[r][k] = word(a, r·ars + k·acs), B[k] = the 16·V words at b + k·ldb
// (in words). beta == 0 never reads C. The packed GEMM calls it on packed panels (ars = 1,
// acs = R, ldb = 16·V: constants after inlining), the attention on its tiles and panels.
template <int R, int V>
__attribute__((target("avx512f,avx512bf16"))) [[gnu::always_inline]] inline void tile(
    int64_t K, float alpha, const void* a, int64_t ars, int64_t acs, const void* b, int64_t ldb, float beta, float* c,
    int64_t ldc) {
  const float* bw = static_cast<const float*>(b);
  __m512 acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512bh bk[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bk[v] = (__m512bh)_mm512_loadu_ps(bw + k * ldb + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(int(word(a, r * ars + k * acs)));  // the word broadcast
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bk[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      float* cp = c + r * ldc + 16 * v;
      const __m512 y = _mm512_mul_ps(_mm512_set1_ps(alpha), acc[r][v]);
      _mm512_storeu_ps(cp, beta == 0.0f ? y : _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_loadu_ps(cp), y));
    }
}

// Words (X[2p][i + t], X[2p + 1][i + t]) for the lanes t of `lanes` (0 elsewhere) of X [K, ·]
// stored with leading dimension ld (a missing row 2p + 1 = K reads as 0): two rows interleaved.
__attribute__((target("avx512f,avx512bw,avx512vl"))) [[gnu::always_inline]] inline __m512i pair_words16(
    const uint16_t* x, int64_t ld, int64_t i, int64_t p, int64_t K, __mmask16 lanes) {
  const __m256i lo = _mm256_maskz_loadu_epi16(lanes, x + 2 * p * ld + i);
  const __m256i hi = 2 * p + 1 < K ? _mm256_maskz_loadu_epi16(lanes, x + (2 * p + 1) * ld + i) : _mm256_setzero_si256();
  // The maskz forms: GCC 12's unmasked ones start from _mm512_undefined_epi32, which -Wmaybe-uninitialized flags.
  const __mmask16 all = 0xffff;
  return _mm512_or_si512(_mm512_maskz_cvtepu16_epi32(all, lo),
                         _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, hi), 16));
}

}  // namespace autosp::cpu::dp16
