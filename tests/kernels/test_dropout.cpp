// The CPU dropout kernel (kernels/cpu/elementwise.h dropout, the mask of kernels/kinds.h) against
// its statistics and the naive mask written out from the spec (tests/common/naive.h): the dropped
// fraction is p (overall and per feature, within 5 standard deviations), kept values are exactly
// x / (1 - p), the mean is preserved, p = 0 is the identity, and the mask of a token depends only
// on (seed, token index, feature): the same whichever row or slice of rows holds the token, which
// is what makes every sequence-parallel layout drop what one process drops.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common/naive.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/kinds.h"

namespace {

using namespace autosp;

std::vector<double> run(const std::vector<double>& x, const std::vector<int64_t>& token, int64_t C, double p,
                        uint64_t seed) {
  std::vector<double> y(x.size());
  cpu::dropout(x.data(), token.data(), y.data(), static_cast<int64_t>(token.size()), C, seed,
               kernels::dropout_threshold(p), 1.0 / (1.0 - p));
  return y;
}

TEST_CASE("dropout drops a fraction p and scales the rest by 1/(1-p)", "[kernels][dropout]") {
  const int64_t rows = 2048, C = 96;
  const double n = double(rows * C);
  std::vector<int64_t> token(rows);
  std::iota(token.begin(), token.end(), int64_t{5000});
  const std::vector<double> ones(static_cast<size_t>(rows * C), 1.0);
  for (double p : {0.05, 0.25, 0.5, 0.9}) {
    INFO("p " << p);
    const std::vector<double> y = run(ones, token, C, p, 1234);
    double dropped = 0, sum = 0;
    std::vector<double> per_feature(static_cast<size_t>(C), 0.0);
    for (size_t i = 0; i < y.size(); ++i) {
      if (y[i] == 0) {
        ++dropped;
        ++per_feature[i % size_t(C)];
      } else {
        REQUIRE(y[i] == 1.0 / (1.0 - p));  // kept: exactly x / (1 - p)
      }
      sum += y[i];
    }
    const double sd = std::sqrt(p * (1 - p) / n);
    CHECK(std::abs(dropped / n - p) < 5 * sd);
    CHECK(std::abs(sum / n - 1.0) < 5 * std::sqrt(p / (1 - p) / n));  // E[y] = x
    const double sd_feature = std::sqrt(p * (1 - p) / double(rows));
    for (double d : per_feature) CHECK(std::abs(d / double(rows) - p) < 5 * sd_feature);
  }
  CHECK(run(ones, token, C, 0.0, 1234) == ones);  // p = 0: nothing dropped
}

TEST_CASE("dropout's mask is the spec's, a function of (seed, token, feature) only", "[kernels][dropout]") {
  const int64_t rows = 64, C = 24;
  std::vector<double> x(static_cast<size_t>(rows * C));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(double(i)) + 2;
  std::vector<int64_t> token(rows);
  for (int64_t r = 0; r < rows; ++r) token[size_t(r)] = 977 * r + 3;
  const std::vector<double> y = run(x, token, C, 0.3, 42);
  const std::vector<double> ref = naive::dropout(x, token, C, 0.3, 42);
  for (size_t i = 0; i < y.size(); ++i) {
    REQUIRE((y[i] == 0) == (ref[i] == 0));  // the same mask
    REQUIRE(y[i] == Approx(ref[i]).epsilon(1e-15));
  }
  // Any block of the rows (a rank's slice of the sequence) drops what the whole did there.
  const int64_t from = 17, count = 20;
  const std::vector<double> xs(x.begin() + from * C, x.begin() + (from + count) * C);
  const std::vector<int64_t> ts(token.begin() + from, token.begin() + from + count);
  CHECK(run(xs, ts, C, 0.3, 42) == std::vector<double>(y.begin() + from * C, y.begin() + (from + count) * C));
  // Another seed is another mask, and so is another token.
  const std::vector<double> other = run(x, token, C, 0.3, 43);
  double same = 0;
  for (size_t i = 0; i < y.size(); ++i) same += (y[i] == 0) == (other[i] == 0);
  CHECK(same / double(y.size()) < 0.8);  // 0.3² + 0.7² = 0.58 expected
  std::vector<int64_t> shifted = token;
  for (auto& t : shifted) ++t;
  CHECK(run(x, shifted, C, 0.3, 42) != y);
}

}  // namespace
