// The bf16 operands of the packed GEMM (gemm_bf16_batched on the avx512_bf16 path): packing into
// micro-panels of bf16 pairs and the vdpbf16ps tile kernel. Not an ordinary header (no include
// guard, no includes): kernels/cpu/matmul.cpp includes it once, inside its anonymous namespace,
// after the f32 packers and tile kernel (Operands, pack_a, pack_b, edge_out, the block sizes),
// whose loops (gemm_thread) it then shares.
//
// vdpbf16ps multiplies the two bf16 pairs held in each 32-bit lane of its sources (exactly: a
// product of two bf16 fits f32) and adds both products into that lane's f32 accumulator (bf16
// denormal inputs read as 0, like the AMX and cuBLAS bf16 paths). So the depth of the packing is
// in pairs: a panel element is one 32-bit word (op(X)[i][2p], op(X)[i][2p + 1]) (low half, high
// half), and an odd K's last pair has 0 in its high half. The panels have the f32 layout, one
// word where the f32 sgemm has one float: A [kc pairs][kMR rows], B [kc pairs][kNR columns];
// one micro-tile step broadcasts an A word and multiplies it into two B vectors (32 columns × 2 k).
//
// Packing, by how an operand is stored:
//   pairs consecutive (op(A) stored [M, K]; op(B) stored [N, K]) with K and the leading dimension
//     even: each row's words are 32-bit elements in place, packed by the f32 packers as floats
//     (their bits are only moved: 16 × 16 in-register transposes where the f32 sgemm has them)
//   k the slow index (op(A) stored [K, M]; op(B) stored [K, N]): rows 2p and 2p + 1 read 16
//     elements at a time and interleaved (zero-extend, shift, or)
//   anything else (odd K or leading dimension): a word at a time.

struct Bf16Operands : GemmOperands<uint16_t> {
  int64_t K;              // in bf16 elements
  bool a_words, b_words;  // op(A)'s rows, op(B)'s columns hold their pairs as aligned words
};

Bf16Operands bf16_operands(bool ta, bool tb, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                           int64_t K) {
  const auto words = [K](const uint16_t* x, int64_t ld) {
    return K % 2 == 0 && ld % 2 == 0 && reinterpret_cast<uintptr_t>(x) % 4 == 0;
  };
  return {{ta, tb, a, lda, b, ldb}, K, !ta && words(a, lda), tb && words(b, ldb)};
}

// The word (X[i][2p], X[i][2p + 1]) of X [rows, K] stored with leading dimension ld.
uint32_t pair_word(const uint16_t* x, int64_t ld, int64_t i, int64_t p, int64_t K) {
  const auto at = [&](int64_t k) -> uint32_t { return k >= K ? 0 : x[i * ld + k]; };
  return at(2 * p) | at(2 * p + 1) << 16;
}

using dp16::pair_words16;  // two rows of X [K, ·] interleaved into pair words

// A word into packed scratch (floats by type; the bits are what matter).
void put_word(float* dst, uint32_t w) { std::memcpy(dst, &w, sizeof w); }

// pack_a's contract in pairs: p0 and kc count words.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_a(const Bf16Operands& o, int64_t i0, int64_t mc,
                                                                int64_t p0, int64_t kc, float* ap) {
  if (o.a_words)
    return pack_a(Operands{false, false, reinterpret_cast<const float*>(o.a), o.lda / 2, nullptr, 0}, i0, mc, p0, kc,
                  ap);
  constexpr __mmask16 kPanel = (1u << kMR) - 1;
  for (int64_t q = 0; q * kMR < mc; ++q) {
    const int64_t rows = std::min(kMR, mc - q * kMR), i = i0 + q * kMR;
    float* dst = ap + q * kc * kMR;
    for (int64_t k = 0; k < kc; ++k) {
      if (o.ta) {
        const __m512i w = pair_words16(o.a, o.lda, i, p0 + k, o.K, __mmask16((1u << rows) - 1));
        _mm512_mask_storeu_epi32(dst + k * kMR, kPanel, w);
        continue;
      }
      for (int64_t r = 0; r < kMR; ++r) put_word(dst + k * kMR + r, r < rows ? pair_word(o.a, o.lda, i + r, p0 + k, o.K) : 0);
    }
  }
}

// pack_b's contract in pairs: p0 and kc count words.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_b(const Bf16Operands& o, int64_t p0, int64_t kc,
                                                                int64_t j0, int64_t nc, int64_t q0, int64_t q1,
                                                                float* bp) {
  if (o.b_words)
    return pack_b(Operands{false, true, nullptr, 0, reinterpret_cast<const float*>(o.b), o.ldb / 2}, p0, kc, j0, nc,
                  q0, q1, bp);
  for (int64_t k = 0; k < kc; ++k)
    for (int64_t q = q0; q < q1; ++q) {
      float* dst = bp + q * kc * kNR + k * kNR;
      const int64_t cols = std::min(kNR, nc - q * kNR), j = j0 + q * kNR;
      if (!o.tb) {
        for (int64_t c0 = 0; c0 < kNR; c0 += 16) {
          const int64_t n = std::clamp<int64_t>(cols - c0, 0, 16);
          _mm512_storeu_si512(dst + c0, pair_words16(o.b, o.ldb, j + c0, p0 + k, o.K, __mmask16((1u << n) - 1)));
        }
        continue;
      }
      for (int64_t c = 0; c < kNR; ++c) put_word(dst + c, c < cols ? pair_word(o.b, o.ldb, j + c, p0 + k, o.K) : 0);
    }
}

// vec16::micro_tile's contract on packed bf16 panels: R rows × 16·V columns over kc pairs.
template <int R, int V>
__attribute__((target("avx512f,avx512bf16"))) [[gnu::always_inline]] inline void dp_tile(int64_t kc, float alpha,
                                                                                          const float* ap, const float* bp,
                                                                                          float beta, float* c, int64_t ldc) {
  dp16::tile<R, V>(kc, alpha, ap, 1, kMR, bp, 16 * V, beta, c, ldc);
}

// kernel's contract on packed bf16 panels (kc pairs).
__attribute__((target("avx512f,avx512bf16"))) void kernel(const Bf16Operands&, int64_t kc, float alpha,
                                                          const float* ap, const float* bp, float beta, const float* c,
                                                          int64_t ldc, int64_t rows, int64_t cols, float* out,
                                                          int64_t ldo) {
  if (rows == kMR && cols == kNR && out == c) return dp_tile<kMR, kNR / 16>(kc, alpha, ap, bp, beta, out, ldo);
  alignas(64) float tile[kMR * kNR];
  if (rows <= 4) dp_tile<4, kNR / 16>(kc, 1.0f, ap, bp, 0.0f, tile, kNR);
  else if (rows <= 8) dp_tile<8, kNR / 16>(kc, 1.0f, ap, bp, 0.0f, tile, kNR);
  else dp_tile<kMR, kNR / 16>(kc, 1.0f, ap, bp, 0.0f, tile, kNR);
  edge_out(tile, alpha, beta, c, ldc, rows, cols, out, ldo);
}
