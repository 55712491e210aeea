// Element conversions between the storage dtypes on the host: bf16 / f16 are raw uint16_t bit
// patterns; float→bf16 and float→f16 round to nearest even, double→bf16 rounds once.
// Tensor::to() and the CPU kernels share them (the CPU elementwise header re-exports them), so
// there is one copy of each rounding. Namespace autosp::cpu: host loops, named like the CPU
// kernels that use them. Knows nothing of graphs, kernels or devices.
#pragma once

#include <cstdint>

namespace autosp::cpu {

float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// double → bf16 rounded once, to nearest even (not through f32, which would round twice).
uint16_t f64_to_bf16(double d);

// y[i] = x[i] converted, for From, To in {float, double, uint16_t = bf16 bits}: to bf16 rounds to
// nearest even (NaN stays NaN, past the range → ±inf); bf16 → f32/f64 and f32 → f64 are exact.
template <class From, class To>
void cast(const From* x, To* y, int64_t n);

}  // namespace autosp::cpu
