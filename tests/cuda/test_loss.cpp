// CUDA cross-entropy (sum into a device scalar, deterministic), count_valid and the backward
// (also in place) against the CPU kernels: the op-case shape with ignored labels, and a GPT-2
// vocabulary.
#include <cmath>

#include "cuda/cuda_test.h"
#include "kernels/cpu/loss.h"
#include "kernels/cuda/loss.cuh"

using namespace autosp;
using namespace autosp::cudatest;

TEMPLATE_TEST_CASE("cuda cross-entropy matches the CPU", "[cuda][loss]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  using A = cuda::acc_t<T>;
  struct Case {
    int64_t rows, V;
  };
  uint32_t seed = 500;
  for (const Case c : {Case{10, 9}, Case{512, 50257}, Case{3, 1}, Case{0, 4}}) {
    INFO("rows " << c.rows << " V " << c.V);
    std::vector<int64_t> labels(static_cast<size_t>(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) labels[size_t(r)] = r % 5 == 3 ? cpu::kIgnoreIndex : (r * 7919) % c.V;
    const auto logits = values<T>(naive::random_normal(c.rows * c.V, seed++, 3.0));
    Dev<T> dlogits(logits), dgrad(size_t(c.rows * c.V));
    Dev<int64_t> dlabels(labels);
    Dev<A> dloss(1), dloss2(1), dcount(1);

    const double ref = cpu::cross_entropy_sum<H>(logits.data(), labels.data(), c.rows, c.V);
    cuda::cross_entropy_sum<T>(dlogits.get(), dlabels.get(), dloss.get(), c.rows, c.V, cpu::kIgnoreIndex, nullptr);
    cuda::cross_entropy_sum<T>(dlogits.get(), dlabels.get(), dloss2.get(), c.rows, c.V, cpu::kIgnoreIndex, nullptr);
    const A got = dloss.download()[0];
    INFO("loss " << got << " ref " << ref);
    CHECK(std::abs(double(got) - ref) <= tol<T>() * (1 + std::abs(ref)));
    CHECK(got == dloss2.download()[0]);

    const int64_t valid = cpu::count_valid(labels.data(), c.rows);
    cuda::count_valid<A>(dlabels.get(), c.rows, cpu::kIgnoreIndex, dcount.get(), nullptr);
    CHECK(dcount.download()[0] == A(valid));

    const double g = valid > 0 ? 1.0 / double(valid) : 1.0;
    Dev<A> dg(std::vector<A>{A(g)});
    std::vector<H> grad(logits.size());
    cpu::cross_entropy_backward<H>(logits.data(), labels.data(), grad.data(), c.rows, c.V, double(A(g)));
    cuda::cross_entropy_backward<T>(dlogits.get(), dlabels.get(), dgrad.get(), c.rows, c.V, dg.get(), cpu::kIgnoreIndex,
                                    nullptr);
    check_against<T>(dgrad.download(), grad);
    cuda::cross_entropy_backward<T>(dlogits.get(), dlabels.get(), dlogits.get(), c.rows, c.V, dg.get(),
                                    cpu::kIgnoreIndex, nullptr);  // in place
    check_against<T>(dlogits.download(), grad);
  }
}

TEST_CASE("cuda cross-entropy: an invalid label makes the loss NaN", "[cuda][loss]") {
  const std::vector<float> logits(2 * 4, 0.5f);
  const std::vector<int64_t> labels = {1, 4};
  Dev<float> dlogits(logits), dloss(1);
  Dev<int64_t> dlabels(labels);
  cuda::cross_entropy_sum<float>(dlogits.get(), dlabels.get(), dloss.get(), 2, 4, cpu::kIgnoreIndex, nullptr);
  CHECK(std::isnan(dloss.download()[0]));
}
