// The tile products of the CPU flash attention on bf16 operands (sdpa_forward_bf16,
// sdpa_backward_bf16): Bf16Tiles<Products>, the bf16 counterpart of WideTiles, its products on
// AVX512-BF16 (DpProducts: vdpbf16ps) or on AMX tiles (AmxProducts<amx::HwTiles>, or on the
// software tiles for tests). Not an ordinary header (no include guard, no includes):
// kernels/cpu/attention.cpp includes it once, inside its anonymous namespace, after
// keys_panel_avx512, and its kernel bodies run on it.
//
// Numerics (PyTorch's CPU flash attention in bf16 does the same): every product multiplies bf16
// values exactly and accumulates in f32 (vdpbf16ps, dp16.h; or TDPBF16PS, which also reads bf16
// denormals as 0 and flushes f32 denormal sums); the score tile, the softmax and its
// sums, dP and dS are f32; what a product reads from a tile (P for P·V and Pᵀ·dO, dS for dS·K and
// dSᵀ·Q) is rounded to bf16 once, when it is packed (vcvtne2ps2bf16, to nearest even). The output
// accumulators (o, dq per query block; dk, dv per chunk) are f32, each result rounded once.
//
// Operands, in pair words (dp16.h) along each product's depth:
//   Q·Kᵀ, dO·Vᵀ    depth D: Q, dO rows are words in place (D even); K, V word-transposed into a
//                  panel [D/2, BK] by keys_panel on words (16 × 16 word transposes)
//   P·V, dS·K      depth keys: P, dS rows packed into words (a_rows); V, K rows 2p, 2p + 1
//                  interleaved (pairs) [BK/2, D]
//   Pᵀ·dO, dSᵀ·Q   depth queries: P, dS rows 2r, 2r + 1 interleaved per key (p_cols, ds_cols)
//                  [BQ/2, BK]; dO, Q rows interleaved (q_pairs, do_pairs) [BQ/2, D] once per
//                  query block. A strip of keys starting at an odd row r0 starts at row r0 - 1,
//                  whose P and dS are 0 on those keys (it sees only the keys before them).

// C [M, N] (ldc) = alpha · A · B + beta · C over K pairs, A[m][k] = word(a, m·ars + k·acs), B[k] =
// b + k·ldb (words): strips of 64, 32, 16 columns as gemm_avx512, the last N % 16 plainly.
template <int R, int V>
__attribute__((target("avx512f,avx512bf16"))) [[gnu::always_inline]] inline void dp_strip(
    int64_t M, int64_t K, float alpha, const void* a, int64_t ars, int64_t acs, const uint32_t* b, int64_t ldb,
    float beta, float* c, int64_t ldc) {
  const auto at = [&](int64_t m) { return static_cast<const uint32_t*>(a) + m * ars; };
  int64_t m = 0;
  for (; m + R <= M; m += R) dp16::tile<R, V>(K, alpha, at(m), ars, acs, b, ldb, beta, c + m * ldc, ldc);
  for (; m + 4 <= M; m += 4) dp16::tile<4, V>(K, alpha, at(m), ars, acs, b, ldb, beta, c + m * ldc, ldc);
  for (; m < M; ++m) dp16::tile<1, V>(K, alpha, at(m), ars, acs, b, ldb, beta, c + m * ldc, ldc);
}

float low_half(uint32_t w) { return std::bit_cast<float>(w << 16); }
float high_half(uint32_t w) { return std::bit_cast<float>(w & 0xffff0000u); }

__attribute__((target("avx512f,avx512bf16"))) void dp_gemm(int64_t M, int64_t N, int64_t K, float alpha, const void* a,
                                                           int64_t ars, int64_t acs, const uint32_t* b, int64_t ldb,
                                                           float beta, float* c, int64_t ldc) {
  int64_t n = 0;
  for (; n + 64 <= N; n += 64) dp_strip<6, 4>(M, K, alpha, a, ars, acs, b + n, ldb, beta, c + n, ldc);
  for (; n + 32 <= N; n += 32) dp_strip<12, 2>(M, K, alpha, a, ars, acs, b + n, ldb, beta, c + n, ldc);
  for (; n + 16 <= N; n += 16) dp_strip<8, 1>(M, K, alpha, a, ars, acs, b + n, ldb, beta, c + n, ldc);
  for (int64_t m = 0; m < M && n < N; ++m)
    for (int64_t j = n; j < N; ++j) {
      float sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t x = dp16::word(a, m * ars + k * acs), y = b[k * ldb + j];
        sum += low_half(x) * low_half(y) + high_half(x) * high_half(y);
      }
      c[m * ldc + j] = beta == 0.0f ? alpha * sum : alpha * sum + beta * c[m * ldc + j];
    }
}

// The first n < 16 lanes.
inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(n, 0)) - 1); }

// out [(rows + 1)/2, D] words: rows 2p and 2p + 1 of x [rows, D] interleaved (a missing last row 0).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pack_pairs(const uint16_t* x, int64_t rows, int64_t D,
                                                                    uint32_t* out) {
  for (int64_t p = 0; 2 * p < rows; ++p)
    for (int64_t d = 0; d < D; d += 16)
      _mm512_mask_storeu_epi32(out + p * D + d, lanes(D - d), dp16::pair_words16(x, D, d, p, rows, lanes(D - d)));
}

// out [M, ·] (ldo bf16) = t [M, n] (ldt) rounded to bf16: each row's keys in pair words.
__attribute__((target("avx512f,avx512bf16"))) void pack_rows(const float* t, int64_t M, int64_t n, int64_t ldt,
                                                             uint16_t* out, int64_t ldo) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < n; j += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(lanes(n - j), t + r * ldt + j);
      const __m512 hi = _mm512_maskz_loadu_ps(lanes(n - j - 16), t + r * ldt + j + 16);
      _mm512_storeu_si512(out + r * ldo + j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

// out [(M + 1)/2, ·] (ldo words) = t [M, n] (ldt) rounded to bf16, rows 2r and 2r + 1 interleaved
// per key (a missing last row 0).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void pack_cols(const float* t, int64_t M, int64_t n,
                                                                      int64_t ldt, uint32_t* out, int64_t ldo) {
  // vcvtne2ps2bf16 puts the second row's 16 values after the first's; this permutation interleaves them.
  const __m512i mix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t p = 0; 2 * p < M; ++p)
    for (int64_t j = 0; j < n; j += 16) {
      const __m512 lo = _mm512_maskz_loadu_ps(lanes(n - j), t + 2 * p * ldt + j);
      const __m512 hi = 2 * p + 1 < M ? _mm512_maskz_loadu_ps(lanes(n - j), t + (2 * p + 1) * ldt + j) : _mm512_setzero_ps();
      _mm512_storeu_si512(out + p * ldo + j, _mm512_permutexvar_epi16(mix, (__m512i)_mm512_cvtne2ps_pbh(hi, lo)));
    }
}

// The products on AVX512-BF16: dp_gemm's contract (above).
struct DpProducts {
  void gemm(int64_t M, int64_t N, int64_t K, float alpha, const void* a, int64_t ars, int64_t acs, const uint32_t* b,
            int64_t ldb, float beta, float* c, int64_t ldc) {
    dp_gemm(M, N, K, alpha, a, ars, acs, b, ldb, beta, c, ldc);
  }
};

// dp_gemm's contract on AMX tiles (Tiles: amx::HwTiles, or amx::EmulatedTiles in tests): C in
// blocks of 32 × 32 on four C tiles (0–3), A's 16 × 16-pair tiles on 4 and 5, B's 16-pair ×
// 16-column tiles on 6 and 7, one TDPBF16PS per pair of them and 16 pairs of depth. B is already in
// the pair rows TDPBF16PS reads: a tile loads from b in place where its 16 rows and columns lie
// within K and N; A loads in place where its rows hold their pairs contiguously (acs = 1) and
// wholly. Every other tile (the edges past M, N or K; a transposed A) is copied into a 16 × 16
// scratch, zero-padded, so no garbage meets a product. C tiles load from and store to c in place
// where alpha = 1, beta is 0 or 1 and the tile is whole; otherwise through a scratch tile that
// applies alpha and beta. The thread's tiles are configured while the products live.
template <class Tiles>
struct AmxProducts {
  amx::TileUse<Tiles> use;
  alignas(64) uint32_t a_pad[2][16 * 16];
  alignas(64) uint32_t b_pad[2][16 * 16];
  alignas(64) float c_pad[16 * 16];
  std::vector<uint32_t> a_rows;  // a transposed A ([M, K] pairs, rows padded to 16 with zeros)

  // A transposed (acs ≠ 1, rows 1 word apart) copied into a_rows as [M rows, ⌈K⌉₁₆ pairs], 16 × 16
  // words at a time through registers; returns its row stride in words.
  __attribute__((target("avx512f"))) int64_t transpose_a(int64_t M, int64_t K, const void* a, int64_t acs) {
    const int64_t kp = (K + 15) / 16 * 16;
    a_rows.resize(size_t(M * kp));  // every word is written below, the padding past K as 0
    int64_t m = 0;
    for (; m + 16 <= M; m += 16)
      for (int64_t k0 = 0; k0 < K; k0 += 16) {
        vec16::f32x16 v[16];
        for (int64_t k = 0; k < 16; ++k)
          v[k] = k0 + k < K ? vec16::load(static_cast<const float*>(a) + (k0 + k) * acs + m) : vec16::splat(0.0f);
        vec16::transpose16(v);
        for (int64_t r = 0; r < 16; ++r) vec16::store(reinterpret_cast<float*>(a_rows.data()) + (m + r) * kp + k0, v[r]);
      }
    for (; m < M; ++m)
      for (int64_t k = 0; k < kp; ++k) a_rows[size_t(m * kp + k)] = k < K ? dp16::word(a, k * acs + m) : 0u;
    return kp;
  }

  // Where A's tile at rows m0, pairs k0 is read from (pointer, row stride in bytes).
  std::pair<const void*, int64_t> a_tile(int64_t M, int64_t K, const void* a, int64_t ars, int64_t acs, int64_t m0,
                                         int64_t k0, int which) {
    if (acs == 1 && m0 + 16 <= M && (k0 + 16 <= K || a == a_rows.data()))  // a_rows: zero past K
      return {static_cast<const uint32_t*>(a) + m0 * ars + k0, ars * 4};
    uint32_t* t = a_pad[which];
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t k = 0; k < 16; ++k)
        t[r * 16 + k] = m0 + r < M && k0 + k < K ? dp16::word(a, (m0 + r) * ars + (k0 + k) * acs) : 0u;
    return {t, 64};
  }
  // Where B's tile at pairs k0, columns n0 is read from.
  std::pair<const void*, int64_t> b_tile(int64_t N, int64_t K, const uint32_t* b, int64_t ldb, int64_t k0, int64_t n0,
                                         int which) {
    if (k0 + 16 <= K && n0 + 16 <= N) return {b + k0 * ldb + n0, ldb * 4};
    uint32_t* t = b_pad[which];
    for (int64_t k = 0; k < 16; ++k)
      for (int64_t j = 0; j < 16; ++j) t[k * 16 + j] = k0 + k < K && n0 + j < N ? b[(k0 + k) * ldb + n0 + j] : 0u;
    return {t, 64};
  }

  template <int CT>
  __attribute__((target("avx512f,amx-tile,amx-bf16"))) [[gnu::always_inline]] inline void c_begin(bool direct, float beta, float* c, int64_t ldc) {
    if (direct && beta == 1.0f)
      Tiles::template load<CT>(c, ldc * 4);
    else
      Tiles::template zero<CT>();
  }
  // The C tile CT at c (rows, cols of it within C): stored in place, or c = alpha · tile + beta · c.
  template <int CT>
  __attribute__((target("avx512f,amx-tile,amx-bf16"))) [[gnu::always_inline]] inline void c_end(bool direct, float alpha, float beta, float* c, int64_t ldc, int64_t rows,
                                           int64_t cols) {
    if (direct) return Tiles::template store<CT>(c, ldc * 4);
    Tiles::template store<CT>(c_pad, 64);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        float& out = c[r * ldc + j];
        out = beta == 0.0f ? alpha * c_pad[r * 16 + j] : alpha * c_pad[r * 16 + j] + beta * out;
      }
  }

  __attribute__((target("avx512f,amx-tile,amx-bf16"))) void gemm(int64_t M, int64_t N, int64_t K, float alpha,
                                                                 const void* a, int64_t ars, int64_t acs,
                                                                 const uint32_t* b, int64_t ldb, float beta, float* c,
                                                                 int64_t ldc) {
    const bool plain = alpha == 1.0f && (beta == 0.0f || beta == 1.0f);
    if (acs != 1) {
      AUTOSP_ASSERT(ars == 1, "AmxProducts: A with row stride ", ars, " and pair stride ", acs);
      ars = transpose_a(M, K, a, acs), acs = 1, a = a_rows.data();
    }
    for (int64_t m0 = 0; m0 < M; m0 += 32)
      for (int64_t n0 = 0; n0 < N; n0 += 32) {
        const bool m2 = m0 + 16 < M, n2 = n0 + 16 < N;  // the block's second row and column of tiles
        const int64_t r0 = std::min<int64_t>(16, M - m0), r1 = m2 ? std::min<int64_t>(16, M - m0 - 16) : 0;
        const int64_t c0 = std::min<int64_t>(16, N - n0), c1 = n2 ? std::min<int64_t>(16, N - n0 - 16) : 0;
        const bool d00 = plain && r0 == 16 && c0 == 16, d01 = plain && r0 == 16 && c1 == 16,
                   d10 = plain && r1 == 16 && c0 == 16, d11 = plain && r1 == 16 && c1 == 16;
        float* cb = c + m0 * ldc + n0;
        c_begin<0>(d00, beta, cb, ldc);
        if (n2) c_begin<1>(d01, beta, cb + 16, ldc);
        if (m2) c_begin<2>(d10, beta, cb + 16 * ldc, ldc);
        if (m2 && n2) c_begin<3>(d11, beta, cb + 16 * ldc + 16, ldc);
        for (int64_t k0 = 0; k0 < K; k0 += 16) {
          const auto a0 = a_tile(M, K, a, ars, acs, m0, k0, 0);
          const auto b0 = b_tile(N, K, b, ldb, k0, n0, 0);
          Tiles::template load<4>(a0.first, a0.second);
          Tiles::template load<6>(b0.first, b0.second);
          Tiles::template dpbf16ps<0, 4, 6>();
          if (n2) {
            const auto b1 = b_tile(N, K, b, ldb, k0, n0 + 16, 1);
            Tiles::template load<7>(b1.first, b1.second);
            Tiles::template dpbf16ps<1, 4, 7>();
          }
          if (m2) {
            const auto a1 = a_tile(M, K, a, ars, acs, m0 + 16, k0, 1);
            Tiles::template load<5>(a1.first, a1.second);
            Tiles::template dpbf16ps<2, 5, 6>();
            if (n2) Tiles::template dpbf16ps<3, 5, 7>();
          }
        }
        c_end<0>(d00, alpha, beta, cb, ldc, r0, c0);
        if (n2) c_end<1>(d01, alpha, beta, cb + 16, ldc, r0, c1);
        if (m2) c_end<2>(d10, alpha, beta, cb + 16 * ldc, ldc, r1, c0);
        if (m2 && n2) c_end<3>(d11, alpha, beta, cb + 16 * ldc + 16, ldc, r1, c1);
      }
  }
};

template <class Products>
struct Bf16Tiles {
  Products products;
  int64_t D, LT, BK;
  std::vector<float> panel;                 // [D/2, LT] words: K or V word-transposed
  std::vector<uint32_t> pairs;              // [LT/2, D]: V (forward) or K (backward) rows interleaved
  std::vector<uint16_t> a_rows;             // [BQ, LT]: a strip of P or dS in bf16
  std::vector<uint32_t> p_cols, ds_cols;    // [BQ/2, LT]: P, dS rows interleaved
  std::vector<uint32_t> q_pairs, do_pairs;  // [BQ/2, D]: the query block's Q, dO rows interleaved

  Bf16Tiles(int64_t D, int64_t BQ, int64_t LT)
      : D(D), LT(LT), BK(LT - kTilePad), panel(size_t(D / 2 * LT)), pairs(size_t(LT / 2 * D)),
        a_rows(size_t(BQ * LT)), p_cols(size_t((BQ + 1) / 2 * LT)), ds_cols(p_cols.size()),
        q_pairs(size_t((BQ + 1) / 2 * D)), do_pairs(q_pairs.size()) {}

  void keys(int64_t bk, const uint16_t* rows) {
    keys_panel_avx512(bk, D / 2, reinterpret_cast<const float*>(rows), panel.data(), LT);
  }
  // c [M, n] (ldc LT) = a [M, D] · the keys' rowsᵀ (the columns up to n rounded to 16 are written).
  void scores(int64_t M, int64_t n, const uint16_t* a, float* c) {
    products.gemm(M, std::min(BK, (n + 15) / 16 * 16), D / 2, 1.0f, a, D / 2, 1, reinterpret_cast<const uint32_t*>(panel.data()),
            LT, 0.0f, c, LT);
  }
  void values(int64_t bk, const uint16_t* rows) { pack_pairs(rows, bk, D, pairs.data()); }
  // acc [M, D] += alpha · p [M, n] (ldp LT, rounded to bf16) · the rows of values().
  void times_values(int64_t M, int64_t n, float alpha, const float* p, float* acc) {
    pack_rows(p, M, n, LT, a_rows.data(), LT);
    products.gemm(M, D, (n + 1) / 2, alpha, a_rows.data(), LT / 2, 1, pairs.data(), D, 1.0f, acc, D);
  }
  void queries(int64_t bq, const uint16_t* q, const uint16_t* dout) {
    pack_pairs(q, bq, D, q_pairs.data());
    pack_pairs(dout, bq, D, do_pairs.data());
  }
  void probs(int64_t bq, int64_t bk, const float* p, const float* ds) {
    pack_cols(p, bq, bk, LT, p_cols.data(), LT);
    pack_cols(ds, bq, bk, LT, ds_cols.data(), LT);
  }
  // Keys [c0, c1) from query rows [r0, bq): dv += Pᵀ·dO, dk += scale · dSᵀ·Q (dv, dk at key c0).
  void key_grads(int64_t c0, int64_t c1, int64_t r0, int64_t bq, float scale, float* dv, float* dk) {
    const int64_t p0 = r0 / 2, K = (bq + 1) / 2 - p0;
    products.gemm(c1 - c0, D, K, 1.0f, p_cols.data() + p0 * LT + c0, 1, LT, do_pairs.data() + p0 * D, D, 1.0f, dv, D);
    products.gemm(c1 - c0, D, K, scale, ds_cols.data() + p0 * LT + c0, 1, LT, q_pairs.data() + p0 * D, D, 1.0f, dk, D);
  }
};
