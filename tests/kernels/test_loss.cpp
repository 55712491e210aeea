// CPU cross_entropy_sum and count_valid against the naive double cross-entropy: odd shapes, large
// logits (stability), ignore_index (default and custom), and UsageError for a bad label.
// cross_entropy_backward against the naive softmax - onehot and central differences of
// cross_entropy_sum (double).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/cpu/loss.h"
#include "kernels/bf16_test.h"
#include "tensor/check.h"

namespace {

using namespace autosp;

std::vector<int64_t> random_labels(int64_t rows, int64_t V, uint32_t seed, int64_t ignore_index) {
  std::mt19937 gen(seed);
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (int64_t& y : labels) y = gen() % 5 == 0 ? ignore_index : int64_t(gen() % uint32_t(V));
  return labels;
}

// The cases of the cross-entropy tests against the naive one: odd shapes, each with N(0, 3²) logits
// around 0 and around 1000 (stability) and random labels, a fifth of them ignore_index; the data from
// seeds `seed`, `seed` + 1, ...; `check(rows, V, logits, labels)` runs under an INFO naming the case.
template <class T, class F>
void for_each_loss_case(uint32_t seed, F&& check) {
  struct Case {
    int64_t rows, V;
  };
  for (const Case c : {Case{1, 1}, Case{7, 10}, Case{65, 1000}, Case{130, 257}, Case{3, 50000}}) {
    for (const double offset : {0.0, 1000.0}) {
      INFO("rows " << c.rows << " V " << c.V << " offset " << offset);
      naive::Vec logits = naive::random_normal(c.rows * c.V, seed++, 3.0);
      for (double& x : logits) x += offset;
      const auto lt = test::cast<T>(logits);
      const auto labels = random_labels(c.rows, c.V, seed++, cpu::kIgnoreIndex);
      check(c.rows, c.V, lt, labels);
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("cross_entropy_sum matches the naive cross-entropy", "[kernels][loss]", float,
                   double) {
  using T = TestType;
  for_each_loss_case<T>(700, [](int64_t rows, int64_t V, const std::vector<T>& lt,
                                  const std::vector<int64_t>& labels) {
    const double got = cpu::cross_entropy_sum<T>(lt.data(), labels.data(), rows, V);
    const double ref = naive::cross_entropy(test::widen(lt), labels, rows, V, cpu::kIgnoreIndex);
    test::check_close(std::vector<double>{got}, {ref}, test::tol<T>());
    CHECK(cpu::count_valid(labels.data(), rows) ==
          std::count_if(labels.begin(), labels.end(), [](int64_t y) { return y != -100; }));
  });
}

TEST_CASE("cross_entropy_sum skips ignored rows", "[kernels][loss]") {
  // Two rows of V = 2: row 0 has equal logits (loss log 2), row 1 is ignored.
  const std::vector<double> logits = {1.0, 1.0, 5.0, -5.0};
  const std::vector<int64_t> labels = {1, cpu::kIgnoreIndex};
  CHECK(cpu::cross_entropy_sum<double>(logits.data(), labels.data(), 2, 2) ==
        Approx(std::log(2.0)).epsilon(1e-14));
  CHECK(cpu::count_valid(labels.data(), 2) == 1);
  // A custom ignore_index: label 1 is now ignored, and -100 is an error.
  const std::vector<int64_t> custom = {1, 0};
  CHECK(cpu::cross_entropy_sum<double>(logits.data(), custom.data(), 2, 2, 1) ==
        Approx(std::log1p(std::exp(-10.0))).margin(1e-14));
  CHECK(cpu::count_valid(custom.data(), 2, 1) == 1);
  CHECK_THROWS_AS(cpu::cross_entropy_sum<double>(logits.data(), labels.data(), 2, 2, 1), UsageError);
  // Every row ignored: nothing to sum.
  const std::vector<int64_t> none = {cpu::kIgnoreIndex, cpu::kIgnoreIndex};
  CHECK(cpu::cross_entropy_sum<double>(logits.data(), none.data(), 2, 2) == 0.0);
  CHECK(cpu::count_valid(none.data(), 2) == 0);
}

TEMPLATE_TEST_CASE("cross_entropy_sum rejects a label outside [0, V)", "[kernels][loss]", float,
                   double) {
  using T = TestType;
  const std::vector<T> logits(4 * 10, T(0));
  std::vector<int64_t> labels = {0, 9, 3, 10};
  CHECK_THROWS_AS(cpu::cross_entropy_sum<T>(logits.data(), labels.data(), 4, 10), UsageError);
  CHECK_THROWS_WITH(cpu::cross_entropy_sum<T>(logits.data(), labels.data(), 4, 10),
                    Catch::Contains("label 10") && Catch::Contains("row 3"));
  labels[3] = -1;
  CHECK_THROWS_WITH(cpu::cross_entropy_sum<T>(logits.data(), labels.data(), 4, 10),
                    Catch::Contains("label -1") && Catch::Contains("row 3"));
  labels[3] = 2;
  CHECK_NOTHROW(cpu::cross_entropy_sum<T>(logits.data(), labels.data(), 4, 10));
}

TEMPLATE_TEST_CASE("cross_entropy_backward matches the naive gradient", "[kernels][loss][backward]", float,
                   double) {
  using T = TestType;
  for_each_loss_case<T>(2700, [](int64_t rows, int64_t V, const std::vector<T>& lt,
                                  const std::vector<int64_t>& labels) {
    const double grad = 0.37;
    std::vector<T> d(lt.size(), T(-777));
    cpu::cross_entropy_backward<T>(lt.data(), labels.data(), d.data(), rows, V, grad);
    test::check_close(d, naive::cross_entropy_backward(test::widen(lt), labels, rows, V, grad));
    for (int64_t r = 0; r < rows; ++r)  // ignored rows are exactly zero
      if (labels[size_t(r)] == cpu::kIgnoreIndex)
        for (int64_t j = 0; j < V; ++j) REQUIRE(d[size_t(r * V + j)] == T(0));
  });
  // A custom ignore_index.
  const std::vector<T> logits = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> labels = {1, 0};
  std::vector<T> d(6, T(-777));
  cpu::cross_entropy_backward<T>(logits.data(), labels.data(), d.data(), 2, 3, 1.0, 1);
  test::check_close(d, naive::cross_entropy_backward(test::widen(logits), labels, 2, 3, 1.0, 1));
  CHECK(d[0] == T(0));
}

TEST_CASE("cross_entropy_backward agrees with central differences of cross_entropy_sum",
          "[kernels][loss][backward]") {
  uint32_t seed = 2800;
  for (const int64_t V : {int64_t(2), int64_t(10), int64_t(1000)}) {
    INFO("V " << V);
    const int64_t rows = 13;
    naive::Vec logits = naive::random_normal(rows * V, seed++, 2.0);
    const auto labels = random_labels(rows, V, seed++, cpu::kIgnoreIndex);
    const double grad = 1.0 / 13;
    std::vector<double> d(logits.size());
    cpu::cross_entropy_backward<double>(logits.data(), labels.data(), d.data(), rows, V, grad);
    test::check_directional(logits, naive::random_normal(rows * V, seed++), d, [&] {
      return grad * cpu::cross_entropy_sum<double>(logits.data(), labels.data(), rows, V);
    });
  }
}

// ---- the tiled head + loss ----

namespace {

// The naive reference of the tiled head + loss: logits = x · wᵀ in double, then the naive loss,
// its gradient and each row's first maximum; dx = dlogits · w, dw = dlogitsᵀ · x. With softcap c > 0
// the loss is taken on c · tanh(logits / c), and its gradient times tanh's derivative at the raw
// logits, 1 - tanh²(logits / c) (the chain rule from the raw logits, not from the capped ones).
struct HeadLossRef {
  double loss;
  std::vector<int64_t> predictions;
  naive::Vec dx, dw;
};
HeadLossRef head_loss_ref(const naive::Vec& x, const naive::Vec& w, const std::vector<int64_t>& labels, int64_t rows,
                          int64_t C, int64_t V, double grad, double softcap = 0) {
  const naive::Vec raw = naive::gemm(false, true, rows, V, C, 1.0, x, w, 0.0, {});
  naive::Vec logits = raw;
  if (softcap > 0)
    for (double& z : logits) z = softcap * std::tanh(z / softcap);
  HeadLossRef r{naive::cross_entropy(logits, labels, rows, V), {}, {}, {}};
  for (int64_t i = 0; i < rows; ++i)
    r.predictions.push_back(std::max_element(logits.begin() + i * V, logits.begin() + (i + 1) * V) -
                            (logits.begin() + i * V));
  naive::Vec d = naive::cross_entropy_backward(logits, labels, rows, V, grad);
  if (softcap > 0)
    for (size_t i = 0; i < d.size(); ++i) d[i] *= 1 - std::pow(std::tanh(raw[i] / softcap), 2);
  r.dx = naive::gemm(false, false, rows, C, V, 1.0, d, w, 0.0, {});
  r.dw = naive::gemm(true, false, V, C, rows, 1.0, d, x, 0.0, {});
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("linear_cross_entropy matches the naive head + loss across chunks of rows", "[kernels][loss]",
                   float, double) {
  using T = TestType;
  struct Case {
    int64_t rows, C, V, chunk;  // chunk 0: linear_ce_chunk_rows
  };
  // Chunks of 7 rows: 17 rows are chunks of 7, 7, 3; V = 10,003 leaves a partial 16-lane tail in
  // every row (and a partial 1024-block of the exp sums). The others are one chunk, and the default.
  uint32_t seed = 3100;
  for (const Case c : {Case{17, 4, 10003, 7}, Case{5, 3, 1, 0}, Case{9, 6, 37, 0}, Case{0, 4, 10, 0}}) {
    INFO("rows " << c.rows << " C " << c.C << " V " << c.V << " chunk " << c.chunk);
    const auto x = test::cast<T>(naive::random_normal(c.rows * c.C, seed++, 1.0));
    const auto w = test::cast<T>(naive::random_normal(c.V * c.C, seed++, 1.5));
    const auto labels = random_labels(c.rows, c.V, seed++, cpu::kIgnoreIndex);
    const double grad = 0.31;
    const HeadLossRef ref = head_loss_ref(test::widen(x), test::widen(w), labels, c.rows, c.C, c.V, grad);
    std::vector<T> scratch(size_t(c.chunk > 0 ? c.chunk * c.V : cpu::linear_ce_scratch_elems(c.rows, c.V)));
    std::vector<double> losses;  // one per thread count: the same bits
    test::with_threads({1, 2, 3}, [&](int t) {
      INFO("threads " << t);
      std::vector<int64_t> pred(size_t(c.rows), -1);
      const double got = cpu::linear_cross_entropy_sum<T>(x.data(), w.data(), labels.data(), pred.data(),
                                                          scratch.data(), c.rows, c.C, c.V, cpu::kIgnoreIndex,
                                                          c.chunk);
      test::check_close(std::vector<double>{got}, {ref.loss}, test::tol<T>());
      losses.push_back(got);
      CHECK(pred == ref.predictions);
      std::vector<T> dx(x.size(), T(-777)), dw(w.size(), T(-777));
      cpu::linear_cross_entropy_backward<T>(x.data(), w.data(), labels.data(), grad, dx.data(), dw.data(),
                                            scratch.data(), c.rows, c.C, c.V, cpu::kIgnoreIndex, c.chunk);
      test::check_close(dx, ref.dx);
      test::check_close(dw, ref.dw);
    });
    CHECK((losses[0] == losses[1] && losses[1] == losses[2]));
  }
}

TEST_CASE("linear_cross_entropy: ties pick the first maximum, bad labels are refused before any work",
          "[kernels][loss]") {
  // x = [1], w = [[2], [5], [5], [1]]: logits [2, 5, 5, 1], the maximum first at 1.
  const std::vector<float> x = {1}, w = {2, 5, 5, 1};
  std::vector<float> scratch(size_t(cpu::linear_ce_scratch_elems(1, 4)));
  std::vector<int64_t> pred = {-1};
  std::vector<int64_t> labels = {cpu::kIgnoreIndex};
  CHECK(cpu::linear_cross_entropy_sum<float>(x.data(), w.data(), labels.data(), pred.data(), scratch.data(), 1, 1,
                                             4) == 0.0);
  CHECK(pred[0] == 1);
  labels = {4};
  pred = {-1};
  CHECK_THROWS_WITH(cpu::linear_cross_entropy_sum<float>(x.data(), w.data(), labels.data(), pred.data(),
                                                         scratch.data(), 1, 1, 4),
                    Catch::Contains("label 4") && Catch::Contains("row 0"));
  CHECK(pred[0] == -1);
  // A NaN logit makes the row's loss NaN (as in cross_entropy_sum), wherever it sits in the row.
  for (const int64_t at : {int64_t(0), int64_t(17), int64_t(40)}) {
    std::vector<float> wn(41, 1.0f);
    wn[size_t(at)] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> s(size_t(cpu::linear_ce_scratch_elems(1, 41)));
    labels = {3};
    INFO("NaN at " << at);
    CHECK(std::isnan(cpu::linear_cross_entropy_sum<float>(x.data(), wn.data(), labels.data(), pred.data(), s.data(),
                                                          1, 1, 41)));
  }
}

TEST_CASE("linear_cross_entropy_backward agrees with central differences of its forward", "[kernels][loss][backward]") {
  const int64_t rows = 11, C = 5, V = 300;
  uint32_t seed = 3200;
  naive::Vec x = naive::random_normal(rows * C, seed++, 1.0), w = naive::random_normal(V * C, seed++, 1.0);
  const auto labels = random_labels(rows, V, seed++, cpu::kIgnoreIndex);
  std::vector<double> scratch(size_t(cpu::linear_ce_scratch_elems(rows, V))), dx(x.size()), dw(w.size());
  std::vector<int64_t> pred(static_cast<size_t>(rows));
  const double grad = 1.0 / 9;
  cpu::linear_cross_entropy_backward<double>(x.data(), w.data(), labels.data(), grad, dx.data(), dw.data(),
                                             scratch.data(), rows, C, V);
  auto loss = [&] {
    return grad * cpu::linear_cross_entropy_sum<double>(x.data(), w.data(), labels.data(), pred.data(),
                                                        scratch.data(), rows, C, V);
  };
  test::check_directional(x, naive::random_normal(rows * C, seed++), dx, loss);
  test::check_directional(w, naive::random_normal(V * C, seed++), dw, loss);
}

// The bf16 head + loss against the naive one on the same bf16 values: the loss (f32 logits, a sum
// in double) within f32's tolerance, the predictions exact, dx and dw (dlogits rounded to bf16 as
// the GEMMs' operand, each output once) within the CUDA tests' bf16 bound, relative L2 5e-3. On
// each bf16 GEMM path the CPU has (a path it lacks says SKIPPED).
TEST_CASE("linear_cross_entropy on bf16 matches the naive head + loss", "[kernels][loss][bf16]") {
  test::for_each_bf16_path([](cpu::Bf16Gemm path) {
    uint32_t seed = 3300;
    for (const int64_t chunk : {int64_t(7), int64_t(0)}) {
      INFO("chunk " << chunk);
      const int64_t rows = 17, C = 40, V = 1003;
      const std::vector<uint16_t> x = test::to_bf16(naive::random_normal(rows * C, seed++, 1.0));
      const std::vector<uint16_t> w = test::to_bf16(naive::random_normal(V * C, seed++, 0.5));
      const auto labels = random_labels(rows, V, seed++, cpu::kIgnoreIndex);
      const double grad = 0.31;
      const HeadLossRef ref = head_loss_ref(test::widen_bf16(x), test::widen_bf16(w), labels, rows, C, V, grad);
      std::vector<float> scratch(size_t(chunk > 0 ? chunk * V : cpu::linear_ce_scratch_elems(rows, V)));
      std::vector<int64_t> pred(size_t(rows), -1);
      const double got = cpu::linear_cross_entropy_sum_bf16(path, x.data(), w.data(), labels.data(), pred.data(),
                                                             scratch.data(), rows, C, V, cpu::kIgnoreIndex, chunk);
      test::check_close(std::vector<double>{got}, {ref.loss}, test::tol<float>());
      CHECK(pred == ref.predictions);
      std::vector<uint16_t> dx(x.size()), dw(w.size());
      cpu::linear_cross_entropy_backward_bf16(path, x.data(), w.data(), labels.data(), grad, dx.data(), dw.data(),
                                              scratch.data(), rows, C, V, cpu::kIgnoreIndex, chunk);
      CHECK(test::relative_l2(test::widen_bf16(dx), ref.dx) <= 5e-3);
      CHECK(test::relative_l2(test::widen_bf16(dw), ref.dw) <= 5e-3);
    }
  });
}

// Gemma's final softcap inside the tiled loss (decision 178): the loss, the argmax, dx and dw against
// the naive capped head + loss, over chunks of rows and at 1 and 2 threads, in double, float and
// bf16; the cap bends these logits enough that the uncapped loss is far off (so the cap is applied).
TEMPLATE_TEST_CASE("linear_cross_entropy with a final logit softcap matches the naive capped head + loss",
                   "[kernels][loss][softcap]", float, double) {
  using T = TestType;
  const int64_t rows = 13, C = 6, V = 531, chunk = 5;
  const double cap = 3.0, grad = 0.27;
  const auto x = test::cast<T>(naive::random_normal(rows * C, 3400, 1.0));
  const auto w = test::cast<T>(naive::random_normal(V * C, 3401, 1.5));
  const auto labels = random_labels(rows, V, 3402, cpu::kIgnoreIndex);
  const HeadLossRef ref = head_loss_ref(test::widen(x), test::widen(w), labels, rows, C, V, grad, cap);
  const HeadLossRef uncapped = head_loss_ref(test::widen(x), test::widen(w), labels, rows, C, V, grad);
  REQUIRE(std::abs(uncapped.loss - ref.loss) > 0.1 * std::abs(ref.loss));
  std::vector<T> scratch(size_t(chunk * V));
  test::with_threads({1, 2}, [&](int t) {
    INFO("threads " << t);
    std::vector<int64_t> pred(size_t(rows), -1);
    const double got = cpu::linear_cross_entropy_sum<T>(x.data(), w.data(), labels.data(), pred.data(), scratch.data(),
                                                        rows, C, V, cpu::kIgnoreIndex, chunk, nullptr, cap);
    test::check_close(std::vector<double>{got}, {ref.loss}, test::tol<T>());
    CHECK(pred == ref.predictions);
    std::vector<T> dx(x.size(), T(-777)), dw(w.size(), T(-777));
    cpu::linear_cross_entropy_backward<T>(x.data(), w.data(), labels.data(), grad, dx.data(), dw.data(),
                                          scratch.data(), rows, C, V, cpu::kIgnoreIndex, chunk, nullptr, cap);
    test::check_close(dx, ref.dx);
    test::check_close(dw, ref.dw);
  });
}

TEST_CASE("linear_cross_entropy on bf16 with a final logit softcap matches the naive capped head + loss",
          "[kernels][loss][bf16][softcap]") {
  test::for_each_bf16_path([](cpu::Bf16Gemm path) {
    const int64_t rows = 17, C = 40, V = 1003, chunk = 7;
    const double cap = 2.5, grad = 0.31;
    const std::vector<uint16_t> x = test::to_bf16(naive::random_normal(rows * C, 3500, 1.0));
    const std::vector<uint16_t> w = test::to_bf16(naive::random_normal(V * C, 3501, 0.5));
    const auto labels = random_labels(rows, V, 3502, cpu::kIgnoreIndex);
    const HeadLossRef ref = head_loss_ref(test::widen_bf16(x), test::widen_bf16(w), labels, rows, C, V, grad, cap);
    std::vector<float> scratch(size_t(chunk * V));
    std::vector<int64_t> pred(size_t(rows), -1);
    const double got = cpu::linear_cross_entropy_sum_bf16(path, x.data(), w.data(), labels.data(), pred.data(),
                                                           scratch.data(), rows, C, V, cpu::kIgnoreIndex, chunk,
                                                           nullptr, cap);
    test::check_close(std::vector<double>{got}, {ref.loss}, test::tol<float>());
    CHECK(pred == ref.predictions);
    std::vector<uint16_t> dx(x.size()), dw(w.size());
    cpu::linear_cross_entropy_backward_bf16(path, x.data(), w.data(), labels.data(), grad, dx.data(), dw.data(),
                                            scratch.data(), rows, C, V, cpu::kIgnoreIndex, chunk, nullptr, cap);
    CHECK(test::relative_l2(test::widen_bf16(dx), ref.dx) <= 5e-3);
    CHECK(test::relative_l2(test::widen_bf16(dw), ref.dw) <= 5e-3);
  });
}

TEST_CASE("linear_cross_entropy's row terms and row gradients (DPO's tiled sums) equal each row's naive head + loss",
          "[kernels][loss][dpo]") {
  // 11 rows in chunks of 4 (4, 4, 3); each row's term, and the backward with a gradient per row
  // (0 on some, as DPO's rows outside every sequence), against the naive head + loss of that row
  // alone with that gradient: dx row by row, dw the sum over the rows.
  const int64_t rows = 11, C = 5, V = 29, chunk = 4;
  const auto x = naive::random_normal(rows * C, 4100, 1.0), w = naive::random_normal(V * C, 4101, 1.5);
  const auto labels = random_labels(rows, V, 4102, cpu::kIgnoreIndex);
  std::vector<double> row_grad(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) row_grad[size_t(r)] = r % 3 == 0 ? 0.0 : 0.1 * double(r) - 0.45;
  std::vector<double> scratch(size_t(chunk * V)), row_loss(size_t(rows), -1.0), dx(x.size()), dw(w.size());
  std::vector<int64_t> pred(static_cast<size_t>(rows));
  cpu::linear_cross_entropy_sum<double>(x.data(), w.data(), labels.data(), pred.data(), scratch.data(), rows, C, V,
                                        cpu::kIgnoreIndex, chunk, row_loss.data());
  cpu::linear_cross_entropy_backward<double>(x.data(), w.data(), labels.data(), 0.0, dx.data(), dw.data(),
                                             scratch.data(), rows, C, V, cpu::kIgnoreIndex, chunk, row_grad.data());
  std::vector<double> want_dx, want_dw(w.size(), 0.0), want_loss;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> xr(x.begin() + r * C, x.begin() + (r + 1) * C);
    const HeadLossRef ref = head_loss_ref(xr, w, {labels[size_t(r)]}, 1, C, V, row_grad[size_t(r)]);
    want_loss.push_back(ref.loss);
    want_dx.insert(want_dx.end(), ref.dx.begin(), ref.dx.end());
    for (size_t i = 0; i < w.size(); ++i) want_dw[i] += ref.dw[i];
  }
  test::check_close(row_loss, want_loss, 1e-12);
  test::check_close(dx, want_dx, 1e-12);
  test::check_close(dw, want_dw, 1e-12);
}
