// Tensor conversions: to(dtype) rounds each value once to the target dtype, whatever the source.
#include <catch2/catch.hpp>

#include <cmath>

#include "tensor/tensor.h"

namespace autosp {
namespace {

TEST_CASE("Tensor::to(bf16) from f64 rounds once, not through f32", "[tensor]") {
  // 1 + 2^-8 + 2^-30 lies just above the midpoint of bf16's 1 and 1 + 2^-7: rounded once it goes up.
  // Through f32 it would first become exactly the midpoint (2^-30 is below f32's ulp at 1), which
  // ties to even: down to 1.
  const double x = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  const Tensor t = Tensor::from_vector<double>({3}, {x, -x, 1.0 + std::ldexp(1.0, -8)});
  const std::vector<double> got = t.to(DType::bf16).to_doubles();
  CHECK(got[0] == 1.0 + std::ldexp(1.0, -7));
  CHECK(got[1] == -(1.0 + std::ldexp(1.0, -7)));
  CHECK(got[2] == 1.0);  // an exact tie goes to even
  // f32 sources are unchanged by the fix: the same values as before, exactly representable.
  const Tensor f = Tensor::from_vector<float>({2}, {1.5f, 3.0f});
  CHECK(f.to(DType::bf16).to_doubles() == std::vector<double>{1.5, 3.0});
}

}  // namespace
}  // namespace autosp
