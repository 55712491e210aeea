// Helpers shared by the CPU kernel tests: casting reference data to the kernel's element type and
// comparing kernel output against a naive double reference with a per-type tolerance.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/naive.h"

namespace autosp::test {

template <class T>
std::vector<T> cast(const naive::Vec& x) {
  return std::vector<T>(x.begin(), x.end());
}

// The values the kernel actually sees, widened back to double for the reference.
template <class T>
naive::Vec widen(const std::vector<T>& x) {
  return naive::Vec(x.begin(), x.end());
}

// Tolerance for comparing a T kernel against a double reference: |got - ref| ≤ tol · (1 + |ref|).
template <class T>
constexpr double tol() {
  return sizeof(T) == 4 ? 1e-5 : 1e-12;
}

// Checks every element: |got - ref| ≤ tolerance · (1 + m), where m is |ref| or, when `magnitude` is
// given, the size of the terms that were summed (e.g. Σ|a·b| for a dot product, which bounds the
// rounding error however much the terms cancel). On failure reports the worst index.
template <class T>
void check_close(const std::vector<T>& got, const naive::Vec& ref, double tolerance = tol<T>(),
                 const naive::Vec* magnitude = nullptr) {
  REQUIRE(got.size() == ref.size());
  if (magnitude) REQUIRE(magnitude->size() == ref.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (double(got[i]) == ref[i]) continue;  // exact, including equal infinities
    const double m = magnitude ? (*magnitude)[i] : std::abs(ref[i]);
    const double err = std::abs(double(got[i]) - ref[i]) / (1.0 + m);
    if (!(err <= worst)) {  // also catches NaN
      worst = err;
      at = i;
      if (std::isnan(err)) break;
    }
  }
  INFO("worst element " << at << ": got " << (ref.empty() ? 0.0 : double(got[at])) << " ref "
                        << (ref.empty() ? 0.0 : ref[at]) << " (scaled error " << worst << ")");
  CHECK(worst <= tolerance);
}

}  // namespace autosp::test
