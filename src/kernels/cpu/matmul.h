// CPU GEMM launchers over raw pointers (our packed AVX-512 sgemm, our packed AVX512-BF16 GEMM,
// OpenBLAS). Knows nothing of graphs or tensors.
//
// Row-major throughout. For b in [0, batch):
//   C[b] (M×N) = alpha · op(A[b]) · op(B[b]) + beta · C[b]
// where op(A) is M×K (A stored K×M when trans_a) and op(B) is K×N (B stored N×K when trans_b).
// A[b] starts at a + b·stride_a; a stride of 0 broadcasts that operand over the batch.
#pragma once

#include <cstdint>

namespace autosp::cpu {

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, T alpha,
                  const T* a, int64_t stride_a, const T* b, int64_t stride_b, T beta, T* c,
                  int64_t stride_c);

// The packed AVX-512 sgemm that gemm_batched<float> uses where packed_sgemm_available() (the CPU
// has AVX-512F) and the GEMM is not tiny; exposed for its tests and benchmark. One GEMM,
// C (M×N, ldc) = alpha · op(A) · op(B) + beta · C with leading dimensions lda, ldb of A and B as
// stored; K ≥ 1; beta == 0 never reads C. `threads` > 1 runs an OpenMP region of that many threads
// (inside a parallel region the call runs in the calling thread alone).
bool packed_sgemm_available();
void packed_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads);

// bf16 GEMMs: A and B bf16 (raw uint16_t bits), f32 accumulation, C f32 (or bf16, rounded once:
// gemm_bf16_batched_rounded). The paths, best first; bf16_gemm_best() is the best the
// running CPU has (cpuid, checked once), and bf16_gemm_name() is what the log calls it.
//   amx          tdpbf16ps on AMX tiles (Sapphire Rapids and later; the process asks Linux for
//                the tile state), in the same packed driver: a 32 × 32 micro-tile of four C tiles
//                (kernels/cpu/amx_gemm.inc.h)
//   avx512_bf16  vdpbf16ps: bf16 pairs multiplied exactly and added into f32 lanes, in the packed
//                driver of the f32 sgemm (micro-panels of bf16 pairs; a 14 × 32 f32 tile)
//   f32          "emulated": A and B widened to f32 (exact), then gemm_batched<float>: any x86-64 CPU
// and, never the best, amx_emulated: the amx path's code on a software model of the tiles
// (kernels/cpu/amx_tiles.h), for tests of the AMX kernel and its callers on CPUs without AMX; slow.
// The environment variable AUTOSP_BF16_GEMM caps the choice, as oneDNN's ONEDNN_MAX_CPU_ISA does:
// "amx" (no cap), "avx512_bf16" (AMX left out) or "f32"; another value is a UsageError naming it.
enum class Bf16Gemm { amx, avx512_bf16, f32, amx_emulated };
bool bf16_gemm_available(Bf16Gemm path);
Bf16Gemm bf16_gemm_best();
const char* bf16_gemm_name(Bf16Gemm path);

// The AMX path's GEMM, exposed for its tests and benchmark: packed_sgemm's contract on bf16 A, B
// (leading dimensions in elements) and f32 C, on the hardware tiles or, with `emulated_tiles`, on
// a software model of the tile instructions (kernels/cpu/amx_tiles.h; slow, for tests on CPUs
// without AMX). amx_gemm_available(emulated_tiles): whether this CPU can run it so.
bool amx_gemm_available(bool emulated_tiles);
void amx_gemm(bool emulated_tiles, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc,
              int threads);

// gemm_batched's contract on bf16 A, B and f32 C, on `path` (which must be available).
void gemm_bf16_batched(Bf16Gemm path, bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                       float alpha, const uint16_t* a, int64_t stride_a, const uint16_t* b, int64_t stride_b,
                       float beta, float* c, int64_t stride_c);

// One of them, alpha 1: C [M, N] (f32) = op(A) · op(B) + beta · C (the bf16 kernels' per-chunk GEMMs).
inline void gemm_bf16(Bf16Gemm path, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* a,
                      const uint16_t* b, float beta, float* c) {
  gemm_bf16_batched(path, trans_a, trans_b, 1, M, N, K, 1.0f, a, 0, b, 0, beta, c, 0);
}

// gemm_bf16_batched's contract with beta = 0 and a bf16 C: Y[b] (M×N, batch stride stride_y ≠ 0
// unless batch is 1) = alpha · op(A[b]) · op(B[b]), each element rounded once to bf16 (to nearest
// even) from its f32 sum: the bits of gemm_bf16_batched's f32 C rounded by tensor/convert.h, but
// written by the GEMM's last k-block, with no f32 C in memory. Where the depth takes several
// k-blocks (or on the f32 path), the f32 sums before the last block go to `partials`, the caller's
// scratch of gemm_bf16_partials(...) floats; where that is 0, partials may be null.
int64_t gemm_bf16_partials(Bf16Gemm path, int64_t batch, int64_t M, int64_t N, int64_t K);
void gemm_bf16_batched_rounded(Bf16Gemm path, bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N,
                               int64_t K, float alpha, const uint16_t* a, int64_t stride_a, const uint16_t* b,
                               int64_t stride_b, uint16_t* y, int64_t stride_y, float* partials);

// Number of threads used by OpenMP regions and OpenBLAS (0 = leave as is).
void set_num_threads(int threads);
int num_threads();

}  // namespace autosp::cpu
