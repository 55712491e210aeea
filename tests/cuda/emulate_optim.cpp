// The CUDA AdamW launcher run on the CPU by emulation.h, against the CPU step.
#include "cuda/emulation.h"
//
#include "kernels/cuda/optim.cu"
//
#include "cuda/cuda_test.h"
#include "kernels/cpu/optim.h"

using namespace autosp;
using namespace autosp::cudatest;

TEST_CASE("emulated adamw matches the CPU", "[cuda-emulation][optim]") {
  const int64_t n = 1000;
  auto p = values<float>(naive::random_normal(n, 2400));
  std::vector<float> m(size_t(n), 0.f), v(size_t(n), 0.f), ep = p, em = m, ev = v;
  std::vector<cuda::bf16> copy(static_cast<size_t>(n));
  const float half = 0.5f;
  for (int64_t step = 1; step <= 2; ++step) {
    const auto g = values<cuda::bf16>(naive::random_normal(n, 2400 + uint32_t(step), 0.01));
    const auto gs = to_storage<cuda::bf16>(g);
    std::vector<float> scaled(g.begin(), g.end());
    for (float& x : scaled) x *= half;
    cpu::adamw_step<float>(p.data(), scaled.data(), m.data(), v.data(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
    cuda::adamw_step<float, cuda::bf16>(ep.data(), gs.data(), em.data(), ev.data(), copy.data(), n, 1e-3, 0.9, 0.95,
                                        1e-8, 0.1, step, &half, nullptr);
    check_against<float>(ep, p);
    check_against<float>(em, m);
    check_against<float>(ev, v);
    const auto back = from_storage(copy);
    for (size_t i = 0; i < back.size(); ++i) CHECK(back[i] == round_to<cuda::bf16>(ep[i]));
  }
}
