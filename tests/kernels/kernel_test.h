// Helpers shared by the CPU kernel tests: casting reference data to the kernel's element type,
// comparing kernel output against a naive double reference with a per-type tolerance, checking a
// backward kernel against central differences of its forward kernel, and running a kernel under
// several thread counts.
#pragma once

#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
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

// ‖got − ref‖ / ‖ref‖ (an error measure that sums over many rounded elements).
inline double relative_l2(const naive::Vec& got, const naive::Vec& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// Σ a·b, accumulated in long double so that the loss of a central difference adds little rounding
// of its own.
inline double dot(const naive::Vec& a, const naive::Vec& b) {
  REQUIRE(a.size() == b.size());
  long double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (long double)a[i] * b[i];
  return double(s);
}

// Directional-derivative check of a backward kernel against its forward, in double: with `grad`
// the backward's gradient of loss() with respect to x, checks ⟨grad, u⟩ against the central
// difference (loss(x + h·u) - loss(x - h·u)) / 2h. loss() reads x, which is perturbed in place and
// restored. Relative tolerance: truncation is O(h²) ≈ 1e-12 and rounding ≈ 1e-16 · |loss| / h.
inline void check_directional(naive::Vec& x, const naive::Vec& u, const naive::Vec& grad,
                              const std::function<double()>& loss, double tolerance = 1e-7, double h = 1e-6) {
  REQUIRE(x.size() == u.size());
  const naive::Vec x0 = x;
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] + h * u[i];
  const double plus = loss();
  for (size_t i = 0; i < x.size(); ++i) x[i] = x0[i] - h * u[i];
  const double minus = loss();
  x = x0;
  const double numeric = (plus - minus) / (2 * h), analytic = dot(grad, u);
  INFO("directional derivative: analytic " << analytic << " central difference " << numeric << " relative error "
                                            << std::abs(analytic - numeric) / std::max(std::abs(analytic), 1e-3));
  CHECK(std::abs(analytic - numeric) <= tolerance * std::max(std::abs(analytic), 1e-3));
}

// Runs f() with the OpenMP thread count set to each of `threads`, restoring it afterwards.
inline void with_threads(std::initializer_list<int> threads, const std::function<void(int)>& f) {
  struct Restore {
    int saved = omp_get_max_threads();
    ~Restore() { omp_set_num_threads(saved); }
  } restore;
  for (int t : threads) {
    omp_set_num_threads(t);
    f(t);
  }
}

}  // namespace autosp::test
