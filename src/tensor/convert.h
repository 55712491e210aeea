// Element conversions between the storage dtypes on the host: bf16 / f16 are raw uint16_t bit
// patterns; float→bf16 and float→f16 round to nearest even, double→bf16 rounds once.
// Tensor::to() and the CPU kernels share them (the CPU elementwise header re-exports them), so
// there is one copy of each rounding. Namespace autosp::cpu: host loops, named like the CPU
// kernels that use them. Knows nothing of graphs, kernels or devices.
#pragma once

#include <bit>
#include <cstdint>

namespace autosp::cpu {

// Inline: the CPU kernels call these per element in their own loops.
inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x0040u);  // NaN stays (quiet) NaN
  // Round to nearest even on the 16 dropped bits; a carry moves into the exponent (→ inf at the top).
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// double → bf16 rounded once, to nearest even (not through f32, which would round twice).
uint16_t f64_to_bf16(double d);

// y[i] = x[i] converted, for From, To in {float, double, uint16_t = bf16 bits}: to bf16 rounds to
// nearest even (NaN stays NaN, past the range → ±inf); bf16 → f32/f64 and f32 → f64 are exact.
template <class From, class To>
void cast(const From* x, To* y, int64_t n);

}  // namespace autosp::cpu
