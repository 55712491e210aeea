// AMX detection and the software tiles (kernels/cpu/amx_tiles.h). The emulation follows the Intel
// SDM's descriptions of the instructions, not the GEMM kernel that uses them: TDPBF16PS keeps, per
// output element, two f32 sums (the even and the odd bf16 of each pair), each step one fused
// multiply-add rounded to nearest even, bf16 denormal inputs read as 0 and f32 denormal results
// flushed to 0; then adds the two sums and that into the destination (each addition rounded, with
// the same denormal rules). TILELOADD and TDPBF16PS zero the bytes of a row past its colsb and the
// rows past its rows; LDTILECFG zeroes every tile.
#include "kernels/cpu/amx_tiles.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "tensor/check.h"

namespace autosp::cpu::amx {

namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl's ARCH_REQ_XCOMP_PERM (asm/prctl.h)
constexpr int kXfeatureXtiledata = 18;     // XFEATURE_XTILEDATA: the tile data state component

}  // namespace

bool amx_tiles_granted() {
  static const bool granted = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = d >> 22 & 1, amx_tile = d >> 24 & 1;
    if (!amx_bf16 || !amx_tile) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return false;  // OSXSAVE: xgetbv is allowed
    uint32_t xcr0_lo = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo >> 17 & 3) != 3) return false;  // XTILECFG and XTILEDATA enabled by the OS
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

// ---- the software tiles ----

namespace {

struct TileFile {
  TileConfig config;
  bool configured = false;
  alignas(64) uint8_t tile[kTiles][kMaxRows * kMaxColsb] = {};
};
thread_local TileFile tiles;

// The tile t of the configured register file (asserts what the instructions fault on).
uint8_t* configured_tile(int t) {
  AUTOSP_ASSERT(tiles.configured, "AMX emulation: a tile instruction before LDTILECFG");
  AUTOSP_ASSERT(t >= 0 && t < kTiles, "AMX emulation: tile ", t);
  AUTOSP_ASSERT(tiles.config.rows[t] > 0 && tiles.config.colsb[t] > 0, "AMX emulation: tile ", t, " is not configured");
  return tiles.tile[t];
}

float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
float daz(float x) { return ftz(x); }  // a denormal input reads as a zero of its sign
float bf16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return daz(std::bit_cast<float>(uint32_t(h) << 16));
}

// TDPBF16PS's row loop on widened operands: even[n], odd[n] = the two sums over the pairs k of
// a[2k + e] · b[k][2n + e] (e = 0, 1), each step one fused multiply-add, flushed. Cloned for FMA so
// that std::fma is one instruction where the CPU has it (a libm call otherwise).
__attribute__((target_clones("fma", "default"))) void pair_sums(const float* a, const float* b, int n_pairs,
                                                                  int n_out, float* even, float* odd) {
  for (int k = 0; k < n_pairs; ++k)
    for (int n = 0; n < n_out; ++n) {
      even[n] = ftz(std::fma(a[2 * k], b[k * kMaxColsb / 2 + 2 * n], even[n]));
      odd[n] = ftz(std::fma(a[2 * k + 1], b[k * kMaxColsb / 2 + 2 * n + 1], odd[n]));
    }
}

}  // namespace

void EmulatedTiles::configure(const TileConfig& c) {
  if (c.palette == 0) return release();  // palette 0: the init state
  AUTOSP_ASSERT(c.palette == 1, "AMX emulation: palette ", int(c.palette));
  for (int t = 0; t < 16; ++t) {
    const bool exists = t < kTiles;
    AUTOSP_ASSERT(c.rows[t] <= (exists ? kMaxRows : 0) && c.colsb[t] <= (exists ? kMaxColsb : 0),
                  "AMX emulation: tile ", t, " rows ", int(c.rows[t]), " colsb ", c.colsb[t]);
  }
  tiles.config = c;
  tiles.configured = true;
  std::memset(tiles.tile, 0, sizeof tiles.tile);
}

void EmulatedTiles::release() {
  tiles.configured = false;
  std::memset(tiles.tile, 0, sizeof tiles.tile);
}

void EmulatedTiles::load_tile(int t, const void* base, int64_t stride) {
  uint8_t* dst = configured_tile(t);
  const int rows = tiles.config.rows[t], colsb = tiles.config.colsb[t];
  std::memset(dst, 0, kMaxRows * kMaxColsb);
  for (int r = 0; r < rows; ++r)
    std::memcpy(dst + r * kMaxColsb, static_cast<const uint8_t*>(base) + r * stride, size_t(colsb));
}

void EmulatedTiles::store_tile(int t, void* base, int64_t stride) {
  const uint8_t* src = configured_tile(t);
  for (int r = 0; r < tiles.config.rows[t]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, src + r * kMaxColsb, size_t(tiles.config.colsb[t]));
}

void EmulatedTiles::zero_tile(int t) { std::memset(configured_tile(t), 0, kMaxRows * kMaxColsb); }

void EmulatedTiles::dpbf16ps_tiles(int c, int a, int b) {
  uint8_t *dst = configured_tile(c), *ta = configured_tile(a), *tb = configured_tile(b);
  const TileConfig& cfg = tiles.config;
  AUTOSP_ASSERT(c != a && c != b && a != b, "AMX emulation: TDPBF16PS needs three distinct tiles");
  AUTOSP_ASSERT(cfg.colsb[c] % 4 == 0 && cfg.colsb[a] % 4 == 0 && cfg.colsb[b] == cfg.colsb[c] &&
                    cfg.colsb[a] / 4 == cfg.rows[b] && cfg.rows[a] == cfg.rows[c],
                "AMX emulation: TDPBF16PS shapes C ", int(cfg.rows[c]), "×", cfg.colsb[c], " A ", int(cfg.rows[a]),
                "×", cfg.colsb[a], " B ", int(cfg.rows[b]), "×", cfg.colsb[b]);
  const int n_out = cfg.colsb[c] / 4, n_pairs = cfg.colsb[a] / 4;
  constexpr int kHalves = kMaxColsb / 2;  // bf16 per tile row
  float bw[kMaxRows * kHalves];           // B's bf16 widened (denormals 0), row k: pairs (2n, 2n + 1)
  for (int k = 0; k < n_pairs; ++k)
    for (int h = 0; h < 2 * n_out; ++h) bw[k * kHalves + h] = bf16(tb + k * kMaxColsb + 2 * h);
  for (int m = 0; m < cfg.rows[c]; ++m) {
    float aw[kHalves], even[kMaxColsb / 4] = {}, odd[kMaxColsb / 4] = {};
    for (int h = 0; h < 2 * n_pairs; ++h) aw[h] = bf16(ta + m * kMaxColsb + 2 * h);
    pair_sums(aw, bw, n_pairs, n_out, even, odd);
    float* crow = reinterpret_cast<float*>(dst + m * kMaxColsb);
    for (int n = 0; n < n_out; ++n) crow[n] = ftz(daz(crow[n]) + ftz(even[n] + odd[n]));
    std::memset(dst + m * kMaxColsb + cfg.colsb[c], 0, size_t(kMaxColsb - cfg.colsb[c]));
  }
  std::memset(dst + cfg.rows[c] * kMaxColsb, 0, size_t((kMaxRows - cfg.rows[c]) * kMaxColsb));
}

}  // namespace autosp::cpu::amx
