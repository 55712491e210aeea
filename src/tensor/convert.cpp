// Host dtype conversions: the bit-level roundings and the cast loop (tensor/convert.h).
#include "tensor/convert.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

#include "tensor/strided_loops.h"

namespace autosp::cpu {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / NaN, payload kept
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal: rebias 15 → 127
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // ±0
    bits = sign;
  } else {  // subnormal mant · 2^-24: normalise around its leading bit p
    const int p = std::bit_width(mant) - 1;
    bits = sign | (uint32_t(p + 103) << 23) | ((mant ^ (1u << p)) << (23 - p));
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((x >> 13) & 0x3ffu));  // quiet NaN
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // inf, or ≥ 65520 which rounds to inf
  if (x >= 0x38800000u) {  // normal half (≥ 2^-14): rebias 127 → 15, round 23 → 10 mantissa bits
    uint32_t r = x - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return uint16_t(sign | (r >> 13));
  }
  const uint32_t e = x >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to ±0 (2^-25 itself ties to even 0 below)
  // Subnormal half: value / 2^-24 = mant · 2^(e - 126), rounded to nearest even.
  const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14 … 24
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;  // r may become 0x400, the smallest normal
  return uint16_t(sign | r);
}

uint16_t f64_to_bf16(double d) {
  if (std::isnan(d)) return f32_to_bf16(static_cast<float>(d));
  if (std::fabs(d) < 0x1p-126) {  // bf16 subnormals: multiples of 2^-133, the scaling is exact
    return f32_to_bf16(static_cast<float>(std::nearbyint(d * 0x1p133) * 0x1p-133));
  }
  // Keep 7 of the 52 fraction bits: round to nearest even on the 45 dropped ones (a carry moves
  // into the exponent). The result has 8 significant bits, so it is exact in f32 and in bf16.
  constexpr uint64_t kDrop = (uint64_t(1) << 45) - 1;
  uint64_t x = std::bit_cast<uint64_t>(d);
  x = (x + (kDrop >> 1) + ((x >> 45) & 1u)) & ~kDrop;
  const double r = std::bit_cast<double>(x);
  if (std::fabs(r) >= 0x1p128) return std::signbit(r) ? 0xff80u : 0x7f80u;  // ±inf
  return f32_to_bf16(static_cast<float>(r));
}

namespace {
template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<From, uint16_t>)
    return convert<To>(bf16_to_f32(v));
  else if constexpr (std::is_same_v<To, uint16_t> && std::is_same_v<From, double>)
    return f64_to_bf16(v);
  else if constexpr (std::is_same_v<To, uint16_t>)
    return f32_to_bf16(v);
  else
    return static_cast<To>(v);
}

// f32 → bf16 and back over a range, written branch-free (f32_to_bf16's NaN test as a select) so
// that the compiler vectorises them; cloned for AVX-512 and AVX2. The same bits as the scalar
// conversions.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void f32_to_bf16_range(const float* x, uint16_t* y,
                                                                                     int64_t n) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(x);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = bits[i];
    const uint32_t nan = (b >> 16) | 0x0040u, rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    y[i] = uint16_t((b & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void bf16_to_f32_range(const uint16_t* x, float* y,
                                                                                     int64_t n) {
  uint32_t* bits = reinterpret_cast<uint32_t*>(y);
  for (int64_t i = 0; i < n; ++i) bits[i] = uint32_t(x[i]) << 16;
}
}  // namespace

template <class From, class To>
void cast(const From* x, To* y, int64_t n) {
  if constexpr ((std::is_same_v<From, float> && std::is_same_v<To, uint16_t>) ||
                (std::is_same_v<From, uint16_t> && std::is_same_v<To, float>)) {
    constexpr int64_t kChunk = int64_t(1) << 16;  // per thread at a time
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      if constexpr (std::is_same_v<To, uint16_t>)
        f32_to_bf16_range(x + i0, y + i0, std::min(kChunk, n - i0));
      else
        bf16_to_f32_range(x + i0, y + i0, std::min(kChunk, n - i0));
    }
  } else {
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t i = 0; i < n; ++i) y[i] = convert<To>(x[i]);
  }
}

#define AUTOSP_INSTANTIATE_CAST(From)                                                                 \
  template void cast<From, float>(const From*, float*, int64_t);                                    \
  template void cast<From, double>(const From*, double*, int64_t);                                  \
  template void cast<From, uint16_t>(const From*, uint16_t*, int64_t);
AUTOSP_INSTANTIATE_CAST(float)
AUTOSP_INSTANTIATE_CAST(double)
AUTOSP_INSTANTIATE_CAST(uint16_t)
#undef AUTOSP_INSTANTIATE_CAST

}  // namespace autosp::cpu
