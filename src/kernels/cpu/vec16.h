// 16-lane f32 vectors (GCC vector extensions) and the register-tiled GEMM micro-kernel built on
// them, shared by the CPU attention's tile GEMMs and the packed sgemm (matmul.cpp). Knows nothing
// of graphs, tensors or threads.
//
// A function that uses these is compiled for AVX-512 (`target("avx512f")` or `target_clones`):
// there one f32x16 is one zmm register; in a clone for a narrower ISA GCC splits it (two ymm, four
// xmm). Everything here is always inlined, so the vectors never cross a call; files that include
// this header are built with -Wno-psabi (GCC notes that a 64-byte vector argument's ABI depends on
// the ISA, which does not apply to inlined code).
#pragma once

// One clone of the function per ISA (AVX-512, AVX2, the baseline), picked at load time, so the
// build stays x86-64-v2 while an AVX-512 machine runs one zmm register per f32x16.
#define AUTOSP_VEC16_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

#include <bit>
#include <cstdint>
#include <cstring>

namespace autosp::cpu::vec16 {

using f32x16 = float __attribute__((vector_size(64)));
using i32x16 = int32_t __attribute__((vector_size(64)));

[[gnu::always_inline]] inline f32x16 splat(float x) { return f32x16{} + x; }
[[gnu::always_inline]] inline f32x16 load(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }
// The first n < 16 lanes from p, the others `fill`.
[[gnu::always_inline]] inline f32x16 load_part(const float* p, int64_t n, float fill) {
  f32x16 v = splat(fill);
  std::memcpy(&v, p, size_t(n) * sizeof(float));
  return v;
}
[[gnu::always_inline]] inline void store_part(float* p, f32x16 v, int64_t n) {
  std::memcpy(p, &v, size_t(n) * sizeof(float));
}

[[gnu::always_inline]] inline f32x16 vmin(f32x16 a, f32x16 b) { return a < b ? a : b; }

// e^x per lane for x ≤ 88.37 (Cephes expf, ~1 ulp: x = n·ln2 + r with |r| ≤ ln2/2, a degree-5
// polynomial for e^r, 2^n through the exponent bits); 0 below -87.3, where e^x is subnormal.
[[gnu::always_inline]] inline f32x16 exp16(f32x16 x) {
  const float magic = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer in the low bits
  const f32x16 xc = vmin(x, splat(88.37626f));
  const f32x16 t = xc * 1.44269504088896341f + magic;
  const f32x16 n = t - magic;
  const f32x16 r = xc - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 in two parts
  f32x16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const f32x16 er = p * r * r + r + 1.0f;
  const i32x16 e = ((i32x16)t - std::bit_cast<int32_t>(magic) + 127) << 23;
  return x < -87.33654f ? splat(0.0f) : er * (f32x16)e;
}

// Transposes the 16 × 16 block held in v[0..16) in place: lane c of v[r] becomes lane r of v[c].
// Four rounds of the perfect shuffle (v[2i], v[2i+1] ← the low and high halves of v[i] and v[i+8]
// interleaved), each rotating the 8-bit (row, lane) index left by one bit: 64 two-source permutes.
[[gnu::always_inline]] inline void transpose16(f32x16 (&v)[16]) {
  constexpr i32x16 lo{0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
  constexpr i32x16 hi = lo + 8;
#pragma GCC unroll 4
  for (int round = 0; round < 4; ++round) {
    f32x16 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = __builtin_shuffle(v[i], v[i + 8], lo);
      t[2 * i + 1] = __builtin_shuffle(v[i], v[i + 8], hi);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) v[i] = t[i];
  }
}

// True where the running CPU has AVX-512F (checked once).
inline bool has_avx512f() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

// The micro-kernel: C[r][0, 16·V) = alpha · Σ_k A[r][k] · B[k][0, 16·V) + beta · C for R rows,
// accumulated in R × V registers (R·V + V ≤ 32 zmm); A[r][k] = a[r·ars + k·acs], B[k] = b + k·ldb.
// beta == 0 never reads C (it may hold NaN). The packed sgemm calls it on packed panels
// (ars = 1, acs = R, ldb = 16·V, all constants after inlining), the attention on its tiles in place.
template <int R, int V>
[[gnu::always_inline]] inline void micro_tile(int64_t K, float alpha, const float* a, int64_t ars, int64_t acs,
                                              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
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
      const float ar = a[r * ars + k * acs];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] += ar * bk[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      float* cp = c + r * ldc + 16 * v;
      store(cp, beta == 0.0f ? alpha * acc[r][v] : alpha * acc[r][v] + beta * load(cp));
    }
}

}  // namespace autosp::cpu::vec16
