// The CUDA cross-entropy launchers run on the CPU by emulation.h, against the CPU kernels.
#include "cuda/emulation.h"
//
#include "kernels/cuda/loss.cu"
//
#include "cuda/cuda_test.h"
#include "kernels/cpu/loss.h"

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
