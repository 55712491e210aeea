// The bf16 GEMM on AMX tiles (gemm_bf16_batched on the amx path): the A packing and the tile
// kernel. Not an ordinary header (no include guard, no includes): kernels/cpu/matmul.cpp includes it
// once, inside its anonymous namespace, after matmul_bf16.inc.h, whose operands (Bf16Operands,
// pair words) and B packing it shares, as it shares the loops (gemm_thread) with the f32 sgemm.
//
// TDPBF16PS: C (16 × 16 f32) += A (16 rows × 16 pair words) · B (16 pair rows × 16 columns of pair
// words), f32 accumulation. The micro-tile is 32 × 32 (kAmxRows × kNR): four C tiles (0–3), two A
// tiles (4, 5: rows 0–15, 16–31), two B tiles (6, 7: columns 0–15, 16–31), all 16 rows × 64 bytes;
// each step of 16 pairs (32 k) loads 4 tiles and runs 4 products.
//   A block: micro-panels of kAmxRows rows, each row its kc pair words in order ([32][kc] words; a
//            tile is 16 rows kc words apart); rows past M are 0
//   B block: the AVX512-BF16 path's micro-panels ([kc][kNR] words): rows of pair words, the
//            "VNNI" layout TDPBF16PS reads, a tile 16 words wide and kNR words apart
//   last step of a k-block whose kc is not a multiple of 16: its pairs copied into zero-padded
//            16-pair scratch (the tile shapes are fixed by one configuration per thread and call)
// The C tiles start from C itself (beta = 1) or zero (beta = 0) and are stored into the kernel's
// Out (C, or gemm_thread's f32 block when the result is bf16) where the micro-tile is whole and
// alpha = 1; otherwise they go to a scratch tile and edge_out applies alpha and beta. A thread
// configures its tiles once per GEMM (amx::TileUse) and releases them after. The blocks are
// deeper than the other paths' (kDepth, kBlockRows below).

constexpr int64_t kAmxRows = 32;  // micro-tile rows: two A tiles
constexpr int64_t kAmxStep = 16;  // pairs per TDPBF16PS: an A tile's 64-byte rows
static_assert(kNR == 32);

// Bf16Operands whose kernel runs on Tiles (amx::HwTiles or amx::EmulatedTiles).
template <class Tiles>
struct AmxOperands : Bf16Operands {};

template <class Tiles>
constexpr int64_t kPanelRows<AmxOperands<Tiles>> = kAmxRows;
// k-blocks of up to 1024 pairs (K ≤ 2048 in one block) in A blocks of 160 rows (640 KiB; a B
// micro-panel is 128 KiB, both in L2): TDPBF16PS reads its tiles from L2 fast enough, and a bf16 C
// (gemm_bf16_batched_rounded) of that depth needs no f32 partial sums at all. Against 256 pairs
// and 320 rows, the Llama-768 step's GEMM shapes took 91–93 ms instead of 156–157 ms with a bf16
// C, most of the difference the f32 sums' scratch (docs/performance.md, 2026-12-05).
template <class Tiles>
constexpr int64_t kDepth<AmxOperands<Tiles>> = 1024;
template <class Tiles>
constexpr int64_t kBlockRows<AmxOperands<Tiles>> = 160;
static_assert(kDepth<AmxOperands<amx::HwTiles>> % kAmxStep == 0 && kBlockRows<AmxOperands<amx::HwTiles>> % kAmxRows == 0);

// This thread's tiles configured for the kernel while it lives.
template <class Tiles>
amx::TileUse<Tiles> use_tiles(const AmxOperands<Tiles>&) {
  return {};
}

// pack_a's contract in AMX panels: op(A)[i0 + q·32 + r][pair p0 + k] → ap[q·32·kc + r·kc + k].
template <class Tiles>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_a(const AmxOperands<Tiles>& o, int64_t i0, int64_t mc,
                                                                int64_t p0, int64_t kc, float* ap) {
  for (int64_t q = 0; q * kAmxRows < mc; ++q) {
    const int64_t rows = std::min(kAmxRows, mc - q * kAmxRows), i = i0 + q * kAmxRows;
    float* dst = ap + q * kAmxRows * kc;
    std::memset(dst + rows * kc, 0, size_t((kAmxRows - rows) * kc) * sizeof(float));
    if (!o.ta) {
      for (int64_t r = 0; r < rows; ++r) {
        if (o.a_words) {
          std::memcpy(dst + r * kc, o.a + (i + r) * o.lda + 2 * p0, size_t(kc) * sizeof(float));
          continue;
        }
        for (int64_t k = 0; k < kc; ++k) put_word(dst + r * kc + k, pair_word(o.a, o.lda, i + r, p0 + k, o.K));
      }
      continue;
    }
    // Stored [K, M]: 16 rows × 16 pairs interleaved (rows along lanes), transposed in registers.
    for (int64_t g = 0; g < rows; g += 16) {
      const __mmask16 lanes = __mmask16((1u << std::min<int64_t>(16, rows - g)) - 1);
      int64_t k = 0;
      for (; k + 16 <= kc; k += 16) {
        vec16::f32x16 v[16];
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t) v[t] = vec16::f32x16(pair_words16(o.a, o.lda, i + g, p0 + k + t, o.K, lanes));
        vec16::transpose16(v);
        for (int64_t r = 0; r < std::min<int64_t>(16, rows - g); ++r) vec16::store(dst + (g + r) * kc + k, v[r]);
      }
      for (; k < kc; ++k) {
        alignas(64) float w[16];
        _mm512_store_si512(w, pair_words16(o.a, o.lda, i + g, p0 + k, o.K, lanes));
        for (int64_t r = 0; r < std::min<int64_t>(16, rows - g); ++r) dst[(g + r) * kc + k] = w[r];
      }
    }
  }
}

// The four products of one 16-pair step: A tiles from a (rows 16 apart, lda words), B from b
// (16 pair rows of kNR words).
template <class Tiles>
__attribute__((target("avx512f,avx512bw,avx512vl,amx-tile,amx-bf16"))) [[gnu::always_inline]] inline void amx_step(
    const float* a, int64_t lda, const float* b) {
  Tiles::template load<4>(a, lda * 4);
  Tiles::template load<5>(a + 16 * lda, lda * 4);
  Tiles::template load<6>(b, kNR * 4);
  Tiles::template load<7>(b + 16, kNR * 4);
  Tiles::template dpbf16ps<0, 4, 6>();
  Tiles::template dpbf16ps<1, 4, 7>();
  Tiles::template dpbf16ps<2, 5, 6>();
  Tiles::template dpbf16ps<3, 5, 7>();
}

// kernel's contract on AMX panels (kc pairs; tiles of up to 32 × 32). A whole micro-tile with
// alpha = 1 and beta 0 or 1 starts its C tiles from C or zero and stores them into Out; any other
// goes through a scratch tile and edge_out.
template <class Tiles>
__attribute__((target("avx512f,avx512bw,avx512vl,amx-tile,amx-bf16"))) void kernel(
    const AmxOperands<Tiles>&, int64_t kc, float alpha, const float* ap, const float* bp, float beta, const float* c,
    int64_t ldc, int64_t rows, int64_t cols, float* out, int64_t ldo) {
  const bool direct = rows == kAmxRows && cols == kNR && alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
  const auto at = [](auto* x, int64_t ld, int t) { return x + (t / 2) * 16 * ld + (t % 2) * 16; };
  if (direct && beta == 1.0f) {
    Tiles::template load<0>(at(c, ldc, 0), ldc * 4);
    Tiles::template load<1>(at(c, ldc, 1), ldc * 4);
    Tiles::template load<2>(at(c, ldc, 2), ldc * 4);
    Tiles::template load<3>(at(c, ldc, 3), ldc * 4);
  } else {
    Tiles::template zero<0>();
    Tiles::template zero<1>();
    Tiles::template zero<2>();
    Tiles::template zero<3>();
  }
  int64_t k = 0;
  for (; k + kAmxStep <= kc; k += kAmxStep) amx_step<Tiles>(ap + k, kc, bp + k * kNR);
  if (k < kc) {  // the last pairs, zero-padded to a step
    alignas(64) float a_tail[kAmxRows * kAmxStep] = {}, b_tail[kAmxStep * kNR] = {};
    const int64_t n = kc - k;
    for (int64_t r = 0; r < kAmxRows; ++r) std::memcpy(a_tail + r * kAmxStep, ap + r * kc + k, size_t(n) * 4);
    std::memcpy(b_tail, bp + k * kNR, size_t(n * kNR) * 4);
    amx_step<Tiles>(a_tail, kAmxStep, b_tail);
  }
  if (direct) {
    Tiles::template store<0>(at(out, ldo, 0), ldo * 4);
    Tiles::template store<1>(at(out, ldo, 1), ldo * 4);
    Tiles::template store<2>(at(out, ldo, 2), ldo * 4);
    Tiles::template store<3>(at(out, ldo, 3), ldo * 4);
    return;
  }
  alignas(64) float tile[kAmxRows * kNR];
  Tiles::template store<0>(tile, kNR * 4);
  Tiles::template store<1>(tile + 16, kNR * 4);
  Tiles::template store<2>(tile + 16 * kNR, kNR * 4);
  Tiles::template store<3>(tile + 16 * kNR + 16, kNR * 4);
  edge_out(tile, alpha, beta, c, ldc, rows, cols, out, ldo);
}
