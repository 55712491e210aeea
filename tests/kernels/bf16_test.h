// Helpers of the CPU bf16 kernel tests: bf16 values (raw uint16_t bits) to and from the float64
// reference, and a loop over the bf16 GEMM paths that runs the ones this CPU has and says SKIPPED
// for the others (the AMX kernel on emulated tiles among them, so its callers are tested anywhere).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "common/naive.h"
#include "kernels/cpu/matmul.h"
#include "tensor/convert.h"

namespace autosp::test {

// x rounded once to bf16.
inline std::vector<uint16_t> to_bf16(const naive::Vec& x) {
  std::vector<uint16_t> b;
  for (double v : x) b.push_back(cpu::f64_to_bf16(v));
  return b;
}

// The bf16 values exactly, as doubles.
inline naive::Vec widen_bf16(const std::vector<uint16_t>& b) {
  naive::Vec x;
  for (uint16_t v : b) x.push_back(cpu::bf16_to_f32(v));
  return x;
}

// f(path) for each bf16 GEMM path this CPU has; a WARN saying SKIPPED for each it lacks.
template <class F>
void for_each_bf16_path(F&& f) {
  for (const cpu::Bf16Gemm path :
       {cpu::Bf16Gemm::amx, cpu::Bf16Gemm::avx512_bf16, cpu::Bf16Gemm::f32, cpu::Bf16Gemm::amx_emulated}) {
    if (!cpu::bf16_gemm_available(path)) {
      WARN("SKIPPED: the bf16 GEMM path " << cpu::bf16_gemm_name(path) << " (this CPU lacks it)");
      continue;
    }
    INFO("path " << cpu::bf16_gemm_name(path));
    f(path);
  }
}

}  // namespace autosp::test
