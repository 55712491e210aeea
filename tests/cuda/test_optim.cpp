// CUDA fused AdamW against the CPU step over three steps: fp32 master weights with fp32 or bf16
// gradients (and the bf16 copy-out), a gradient scale read from the device, and double.
#include "cuda/cuda_test.h"
#include "kernels/cpu/optim.h"
#include "kernels/cuda/optim.cuh"

using namespace autosp;
using namespace autosp::cudatest;

TEMPLATE_TEST_CASE("cuda adamw matches the CPU", "[cuda][optim]", float, double, cuda::bf16) {
  using G = TestType;                                                      // gradient storage
  using P = std::conditional_t<std::is_same_v<G, double>, double, float>;  // master weights
  const int64_t n = 100003;
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd = 0.1;
  auto p = values<P>(naive::random_normal(n, 600));
  std::vector<P> m(size_t(n), P(0)), v(size_t(n), P(0));
  Dev<P> dp(p), dm(m), dv(v);
  Dev<cuda::bf16> dcopy(static_cast<size_t>(n));
  const float scale = 0.5f;
  Dev<float> dscale(std::vector<float>{scale});
  for (int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    const auto g = values<G>(naive::random_normal(n, 600 + uint32_t(step), 0.01));
    Dev<G> dg(g);
    const bool scaled = step == 2;
    std::vector<P> gs(g.begin(), g.end());
    if (scaled)
      for (P& x : gs) x = P(x * P(scale));
    cpu::adamw_step<P>(p.data(), gs.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, wd, step);
    cuda::adamw_step<P, G>(dp.get(), dg.get(), dm.get(), dv.get(), std::is_same_v<P, float> ? dcopy.get() : nullptr, n,
                           lr, beta1, beta2, eps, wd, step, scaled ? dscale.get() : nullptr, nullptr);
    const auto got_p = dp.download();
    check_against<P>(got_p, p);
    check_against<P>(dm.download(), m);
    check_against<P>(dv.download(), v);
    if constexpr (std::is_same_v<P, float>) {
      const auto copy = dcopy.download();
      for (size_t i = 0; i < copy.size(); i += 997) CHECK(copy[i] == round_to<cuda::bf16>(got_p[i]));
    }
  }
}
