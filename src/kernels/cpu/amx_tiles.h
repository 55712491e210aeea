// A thin layer over Intel's AMX tiles for the bf16 GEMM (kernels/cpu/amx_gemm.inc.h): tile
// configuration, tile load, store and zero, and TDPBF16PS, in two implementations with one interface.
//   HwTiles        the instructions themselves (Sapphire Rapids and later), where amx_tiles_granted()
//   EmulatedTiles  a software model of the same instructions (Intel SDM, vol. 2: LDTILECFG, TILELOADD,
//                  TILESTORED, TILEZERO, TDPBF16PS), one register file per thread: the kernel's
//                  blocking, packing, edges and accumulation run and are tested on any x86-64 CPU
// The kernel is a template over the two, so the code the tests run is the code the hardware runs.
// Tile numbers are template arguments: GCC 12's _tile_loadd / _tile_stored / _tile_zero /
// _tile_dpbf16ps macros paste their tile argument into the instruction text, so they take a literal
// digit only; HwTiles issues the same instructions with the number as an "i" operand instead. Knows
// nothing of GEMMs.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace autosp::cpu::amx {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;  // palette 1: 8 tiles of 16 rows × 64 bytes

// The 64-byte memory operand of LDTILECFG (SDM vol. 2, "LDTILECFG"): palette 1, then each tile's
// bytes per row and rows (a tile with 0 of both is unused).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Whether this process may run AMX bf16 tiles: CPUID leaf 7 EDX bits 22 (AMX-BF16) and 24
// (AMX-TILE), the OS enabling the tile state in XCR0 (bits 17, 18), and Linux granting this process
// the tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), Linux ≥ 5.16; without it
// the first tile instruction faults). Asked once; later calls return the first answer.
bool amx_tiles_granted();

// The hardware tiles. Every function is always inlined into a caller compiled for amx-tile and
// amx-bf16. Loads and the product clobber "memory": the operands were written by ordinary stores
// just before (GCC's own macros take only the address, which would let those stores sink past).
struct HwTiles {
  // Not GCC's _tile_loadconfig: its asm names only the first 8 bytes of the configuration as read,
  // so the compiler dropped the stores of the rows and bytes per row as dead and LDTILECFG read
  // stack garbage (#GP on the first AMX machine this ran on). The operand here is the whole struct.
  __attribute__((target("amx-tile"))) [[gnu::always_inline]] static inline void configure(const TileConfig& c) {
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
  }
  __attribute__((target("amx-tile"))) [[gnu::always_inline]] static inline void release() { _tile_release(); }
  template <int T>
  __attribute__((target("amx-tile"))) [[gnu::always_inline]] static inline void load(const void* base, int64_t stride) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  __attribute__((target("amx-tile"))) [[gnu::always_inline]] static inline void store(void* base, int64_t stride) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  __attribute__((target("amx-tile"))) [[gnu::always_inline]] static inline void zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  // C += A · B (AT&T operand order: B, A, C).
  template <int C, int A, int B>
  __attribute__((target("amx-tile,amx-bf16"))) [[gnu::always_inline]] static inline void dpbf16ps() {
    __asm__ volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(B), "i"(A), "i"(C) : "memory");
  }
};

// The software tiles: this thread's tile registers and configuration, each operation as the SDM
// describes it (rows and bytes per row from the configuration, the bytes past them zeroed, shapes
// checked where the instruction would raise #UD). Slow: a test tool, never chosen by the dispatch.
struct EmulatedTiles {
  static void configure(const TileConfig& c);
  static void release();
  template <int T>
  static void load(const void* base, int64_t stride) { load_tile(T, base, stride); }
  template <int T>
  static void store(void* base, int64_t stride) { store_tile(T, base, stride); }
  template <int T>
  static void zero() { zero_tile(T); }
  template <int C, int A, int B>
  static void dpbf16ps() { dpbf16ps_tiles(C, A, B); }

  static void load_tile(int t, const void* base, int64_t stride);
  static void store_tile(int t, void* base, int64_t stride);
  static void zero_tile(int t);
  static void dpbf16ps_tiles(int c, int a, int b);
};

// This thread's tiles configured while it lives: all eight 16 rows × 64 bytes (what the GEMM and
// the attention's products use), released after.
template <class Tiles>
struct TileUse {
  __attribute__((target("amx-tile"))) TileUse() {
    TileConfig cfg;
    for (int t = 0; t < kTiles; ++t) cfg.rows[t] = kMaxRows, cfg.colsb[t] = kMaxColsb;
    Tiles::configure(cfg);
  }
  __attribute__((target("amx-tile"))) ~TileUse() { Tiles::release(); }
  TileUse(const TileUse&) = delete;
  TileUse& operator=(const TileUse&) = delete;
};

}  // namespace autosp::cpu::amx
