// The CUDA cross-entropy launchers run on the CPU by emulation.h, against the CPU kernels.
#include "cuda/emulation.h"
//
#include "kernels/cuda/loss.cu"
//
#include "cuda/cuda_test.h"
#include "kernels/cpu/loss.h"

#include <algorithm>
#include <cmath>

using namespace autosp;
using namespace autosp::cudatest;

TEMPLATE_TEST_CASE("emulated cross-entropy launchers match the CPU", "[cuda-emulation][loss]", float, double,
                   cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  using A = cuda::acc_t<T>;
  struct Case {
    int64_t rows, V;
  };
  for (const Case c : {Case{10, 9}, Case{6, 1000}}) {
    std::vector<int64_t> labels(static_cast<size_t>(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) labels[size_t(r)] = r % 5 == 3 ? cpu::kIgnoreIndex : (r * 7919) % c.V;
    const auto logits = values<T>(naive::random_normal(c.rows * c.V, 2200, 3.0));
    const auto ls = to_storage<T>(logits);
    A loss = -1, count = -1;
    cuda::cross_entropy_sum<T>(ls.data(), labels.data(), &loss, c.rows, c.V, cpu::kIgnoreIndex, nullptr);
    const double ref = cpu::cross_entropy_sum<H>(logits.data(), labels.data(), c.rows, c.V);
    CHECK(std::abs(double(loss) - ref) <= tol<T>() * (1 + std::abs(ref)));
    cuda::count_valid<A>(labels.data(), c.rows, cpu::kIgnoreIndex, &count, nullptr);
    CHECK(count == A(cpu::count_valid(labels.data(), c.rows)));
    const A g = A(0.125);
    std::vector<T> d(ls.size());
    std::vector<H> rd(ls.size());
    cuda::cross_entropy_backward<T>(ls.data(), labels.data(), d.data(), c.rows, c.V, &g, cpu::kIgnoreIndex, nullptr);
    cpu::cross_entropy_backward<H>(logits.data(), labels.data(), rd.data(), c.rows, c.V, double(g));
    check_against<T>(from_storage(d), rd);
  }
}

// The tiled head + loss's row pass: each row's loss term (summed by sum_row_losses) against the CPU
// cross_entropy_sum, and each row's argmax against the first maximum; rows with ties included.
TEMPLATE_TEST_CASE("emulated linear_ce_rows matches the CPU loss and argmax", "[cuda-emulation][loss]", float, double,
                   cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  using A = cuda::acc_t<T>;
  for (const int64_t V : {int64_t(9), int64_t(1000), int64_t(4099)}) {
    INFO("V " << V);
    const int64_t rows = 12;
    std::vector<int64_t> labels(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) labels[size_t(r)] = r % 5 == 3 ? cpu::kIgnoreIndex : (r * 7919) % V;
    auto logits = values<T>(naive::random_normal(rows * V, 2300, 3.0));
    for (int64_t j = 0; j < V; ++j) logits[size_t(2 * V + j)] = H(j % 3 == 1 ? 4 : 0);  // row 2: ties, first at 1
    const auto ls = to_storage<T>(logits);
    std::vector<double> row_loss(size_t(rows), -1.0);
    std::vector<int64_t> pred(size_t(rows), -1);
    cuda::linear_ce_rows<T>(ls.data(), labels.data(), row_loss.data(), pred.data(), rows, V, cpu::kIgnoreIndex, nullptr);
    A loss = -1;
    cuda::sum_row_losses<A>(row_loss.data(), rows, &loss, nullptr);
    const double ref = cpu::cross_entropy_sum<H>(logits.data(), labels.data(), rows, V);
    CHECK(std::abs(double(loss) - ref) <= tol<T>() * (1 + std::abs(ref)));
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = logits.begin() + r * V;
      INFO("row " << r);
      CHECK(pred[size_t(r)] == std::max_element(row, row + V) - row);
      if (labels[size_t(r)] == cpu::kIgnoreIndex) CHECK(row_loss[size_t(r)] == 0.0);
    }
    CHECK(pred[2] == 1);
  }
}

// The tiled head + loss's backward over 256 chunks of one row (the chunk count at a 128k
// vocabulary): dx and dw against the float64 chain rule on the same rounded x and w. bf16 dw
// summed in bf16 rounds once more per chunk (several percent here, measured on the code before
// the fix); the f32 sum of ChunkedGradient stays near one GEMM's error. Bounds: 0.5% (bf16),
// 1e-5 (f32, 16 chunks).
TEMPLATE_TEST_CASE("emulated linear_cross_entropy_backward: dw summed over 256 chunks matches float64",
                   "[cuda-emulation][loss]", float, cuda::bf16) {
  using T = TestType;
  using A = cuda::acc_t<T>;
  const int64_t rows = std::is_same_v<T, float> ? 16 : 256, C = 16, V = 40, chunk = 1;
  const auto x = values<T>(around(0.5, rows * C, 2400, 0.5)), w = values<T>(naive::random_normal(V * C, 2401, 0.5));
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) labels[size_t(r)] = r % 7 == 3 ? cpu::kIgnoreIndex : (r * 31) % V;
  const A g = A(0.25);
  // float64: logits = x·wᵀ, dlogits, dx = dlogits·w, dw = dlogitsᵀ·x.
  naive::Vec logits(size_t(rows * V), 0.0), rdx(size_t(rows * C), 0.0), rdw(size_t(V * C), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < C; ++c) logits[size_t(r * V + v)] += double(x[size_t(r * C + c)]) * w[size_t(v * C + c)];
  const naive::Vec d = naive::cross_entropy_backward(logits, labels, rows, V, double(g));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < C; ++c) {
        rdx[size_t(r * C + c)] += d[size_t(r * V + v)] * w[size_t(v * C + c)];
        rdw[size_t(v * C + c)] += d[size_t(r * V + v)] * x[size_t(r * C + c)];
      }
  const auto xs = to_storage<T>(x), ws = to_storage<T>(w);
  std::vector<T> dx(size_t(rows * C)), dw(size_t(V * C)), scratch(size_t(chunk * V));
  std::vector<float> acc(size_t(cuda::ChunkedGradient<T>::acc_elems(V, C)));
  cuda::linear_cross_entropy_backward<T>(xs.data(), ws.data(), labels.data(), &g, dx.data(), dw.data(), rows, C, V,
                                         chunk, cpu::kIgnoreIndex, scratch.data(), acc.empty() ? nullptr : acc.data(),
                                         nullptr);
  const double bound = std::is_same_v<T, float> ? 1e-5 : 5e-3;
  const double e_dw = relative_l2(widen(from_storage(dw)), rdw), e_dx = relative_l2(widen(from_storage(dx)), rdx);
  INFO(type_name<T>() << ": relative L2 error of dw " << e_dw << ", dx " << e_dx);
  CHECK(e_dw <= bound);
  CHECK(e_dx <= bound);
}

// Gemma's final softcap in the tiled loss (decision 178): the forward's chunk capped by cap_logits,
// then linear_ce_rows, against the naive loss of c·tanh(z/c) in float64; the backward
// (linear_cross_entropy_backward with the cap, chunks of 4 rows) against the float64 chain rule
// through the cap, whose derivative is taken at the raw logits. The cap bends these logits: the
// uncapped loss is far off.
TEMPLATE_TEST_CASE("emulated tiled loss with a final logit softcap matches float64", "[cuda-emulation][loss][softcap]",
                   float, cuda::bf16) {
  using T = TestType;
  using A = cuda::acc_t<T>;
  const int64_t rows = 10, C = 16, V = 40, chunk = 4;
  const double cap = 2.0;
  const auto x = values<T>(naive::random_normal(rows * C, 2500, 1.0)), w = values<T>(naive::random_normal(V * C, 2501, 0.8));
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) labels[size_t(r)] = r % 7 == 3 ? cpu::kIgnoreIndex : (r * 31) % V;
  const A g = A(0.25);
  naive::Vec raw(size_t(rows * V), 0.0), capped, rdx(size_t(rows * C), 0.0), rdw(size_t(V * C), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < C; ++c) raw[size_t(r * V + v)] += double(x[size_t(r * C + c)]) * w[size_t(v * C + c)];
  for (const double z : raw) capped.push_back(cap * std::tanh(z / cap));
  const double want = naive::cross_entropy(capped, labels, rows, V);
  REQUIRE(std::abs(naive::cross_entropy(raw, labels, rows, V) - want) > 0.1 * want);
  naive::Vec d = naive::cross_entropy_backward(capped, labels, rows, V, double(g));
  for (size_t i = 0; i < d.size(); ++i) d[i] *= 1 - std::pow(std::tanh(raw[i] / cap), 2);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < C; ++c) {
        rdx[size_t(r * C + c)] += d[size_t(r * V + v)] * w[size_t(v * C + c)];
        rdw[size_t(v * C + c)] += d[size_t(r * V + v)] * x[size_t(r * C + c)];
      }
  // forward: the raw chunk as the GEMM leaves it, capped in place, then the row pass
  auto chunk_logits = to_storage<T>(values<T>(raw));
  cuda::cap_logits<T>(chunk_logits.data(), rows * V, cap, nullptr);
  std::vector<double> row_loss(size_t(rows), -1.0);
  std::vector<int64_t> pred(size_t(rows), -1);
  cuda::linear_ce_rows<T>(chunk_logits.data(), labels.data(), row_loss.data(), pred.data(), rows, V, cpu::kIgnoreIndex,
                          nullptr);
  A loss = -1;
  cuda::sum_row_losses<A>(row_loss.data(), rows, &loss, nullptr);
  CHECK(std::abs(double(loss) - want) <= (std::is_same_v<T, float> ? 1e-5 : 2e-2) * want);
  // backward
  const auto xs = to_storage<T>(x), ws = to_storage<T>(w);
  std::vector<T> dx(size_t(rows * C)), dw(size_t(V * C)), scratch(size_t(chunk * V));
  std::vector<float> acc(size_t(cuda::ChunkedGradient<T>::acc_elems(V, C)));
  cuda::linear_cross_entropy_backward<T>(xs.data(), ws.data(), labels.data(), &g, dx.data(), dw.data(), rows, C, V,
                                         chunk, cpu::kIgnoreIndex, scratch.data(), acc.empty() ? nullptr : acc.data(),
                                         nullptr, cap);
  const double bound = std::is_same_v<T, float> ? 1e-5 : 1e-2;
  const double e_dw = relative_l2(widen(from_storage(dw)), rdw), e_dx = relative_l2(widen(from_storage(dx)), rdx);
  INFO(type_name<T>() << ": relative L2 error of dw " << e_dw << ", dx " << e_dx);
  CHECK(e_dw <= bound);
  CHECK(e_dx <= bound);
}
