// Helpers of the CUDA runtime tests (test_dispatch, test_models, test_device): moving tensor maps to
// device 0 and back, and comparing a CUDA result with its CPU reference with the tolerance of its
// dtype, reporting the worst element.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "device/cuda/device.h"
#include "engine/executor.h"

namespace autosp::cudatest {

inline const Device kGpu{DeviceKind::cuda, 0};

inline Tensor up(const Tensor& t) { return to_device(t, kGpu); }
inline Tensor down(const Tensor& t) { return to_device(t, Device{}); }

inline TensorMap upload(const TensorMap& m) {
  TensorMap out;
  for (const auto& [name, t] : m) out[name] = up(t);
  return out;
}

// |cuda - cpu| ≤ tol · (1 + |cpu|) per element: 1e-5 for f32 (and f64), 1e-2 for bf16 (8 significant
// bits: a few roundings apart).
inline double tolerance_for(DType dt) { return dt == DType::bf16 ? 1e-2 : 1e-5; }

inline void check_tensor(const std::string& what, const Tensor& cuda, const Tensor& cpu, double tol) {
  INFO(what << ": cuda " << cuda.str() << " on " << cuda.device().str() << ", cpu " << cpu.str());
  REQUIRE(cuda.device() == kGpu);
  REQUIRE(cpu.device() == Device{});
  REQUIRE(cuda.dtype() == cpu.dtype());
  REQUIRE(cuda.shape() == cpu.shape());
  const auto got = down(cuda).to_doubles(), want = cpu.to_doubles();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;  // exact, including equal infinities
    const double err = std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i]));
    if (!(err <= worst)) {  // also catches NaN
      worst = err;
      at = i;
      if (std::isnan(err)) break;
    }
  }
  INFO("worst element " << at << " of " << want.size() << ": cuda " << (want.empty() ? 0.0 : got[at]) << ", cpu "
                        << (want.empty() ? 0.0 : want[at]) << " (scaled error " << worst << ", tolerance " << tol << ")");
  CHECK(worst <= tol);
}

}  // namespace autosp::cudatest
