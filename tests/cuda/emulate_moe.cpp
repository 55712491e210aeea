// The CUDA grouped expert MLP (kernels/cuda/moe.cu) run on the CPU by emulation.h, against the
// naive per-token loop of tests/common/naive.h: host routing, the gather, weight-gradient and
// scatter kernels, and the tiled SwiGLU of mlp.cu (compiled in this binary by emulate_mlp.cpp),
// forward, and the backward's dx and dprobs against the CPU kernel (kernels/cpu/moe.h), in f32.
#include "cuda/emulation.h"
//
#include "kernels/cuda/moe.cu"
//
#include "cuda/cuda_test.h"
#include "kernels/cpu/moe.h"

using namespace autosp;
using namespace autosp::cudatest;

TEST_CASE("emulated moe_experts matches the naive loop, and its backward the CPU kernel", "[cuda-emulation][moe]") {
  const int64_t R = 13, C = 8, E = 4, I = 6, k = 2;
  const naive::Vec xv = naive::random_normal(R * C, 5100), dyv = naive::random_normal(R * C, 5101);
  const naive::Vec probs = naive::softmax(naive::random_normal(R * E, 5102), R, E);
  naive::Vec w[3];
  for (int i = 0; i < 3; ++i) w[i] = naive::random_normal(E * I * C, 5103 + i, 0.3);
  std::vector<float> x(xv.begin(), xv.end()), dy(dyv.begin(), dyv.end()), p(probs.begin(), probs.end());
  std::vector<float> wf[3];
  std::vector<const float*> wp[3];
  for (int i = 0; i < 3; ++i) {
    wf[i].assign(w[i].begin(), w[i].end());
    for (int64_t e = 0; e < E; ++e) wp[i].push_back(wf[i].data() + e * I * C);
  }
  naive::Vec xw(x.begin(), x.end()), pw(p.begin(), p.end()), ww[3];
  for (int i = 0; i < 3; ++i) ww[i].assign(wf[i].begin(), wf[i].end());
  std::vector<float> y(size_t(R * C));
  cuda::moe_experts_forward<float>(x.data(), p.data(), wp[0].data(), wp[1].data(), wp[2].data(), y.data(), R, C, E, I,
                                   k, true, {}, nullptr);
  const naive::Vec want = naive::moe_experts(xw, pw, ww[0], ww[1], ww[2], R, C, E, I, k, true);
  CHECK(relative_l2(naive::Vec(y.begin(), y.end()), want) < 1e-5);

  std::vector<float> dx(size_t(R * C)), dp(size_t(R * E)), dx_cpu(dx.size()), dp_cpu(dp.size());
  std::vector<float> dw(size_t(3 * E * I * C)), dw_cpu(dw.size());
  auto experts = [&](std::vector<float>& v, int which) {
    std::vector<float*> out;
    for (int64_t e = 0; e < E; ++e) out.push_back(v.data() + (which * E + e) * I * C);
    return out;
  };
  auto g = experts(dw, 0), u = experts(dw, 1), d = experts(dw, 2);
  auto gc = experts(dw_cpu, 0), uc = experts(dw_cpu, 1), dc = experts(dw_cpu, 2);
  cuda::moe_experts_backward<float>(dy.data(), x.data(), p.data(), wp[0].data(), wp[1].data(), wp[2].data(), dx.data(),
                                    dp.data(), g.data(), u.data(), d.data(), R, C, E, I, k, true, {}, nullptr);
  cpu::moe_experts_backward<float>(dy.data(), x.data(), p.data(), wp[0].data(), wp[1].data(), wp[2].data(),
                                   dx_cpu.data(), dp_cpu.data(), gc.data(), uc.data(), dc.data(), R, C, E, I, k, true);
  auto vec = [](const std::vector<float>& v) { return naive::Vec(v.begin(), v.end()); };
  CHECK(relative_l2(vec(dx), vec(dx_cpu)) < 1e-5);
  CHECK(relative_l2(vec(dp), vec(dp_cpu)) < 1e-5);
  CHECK(relative_l2(vec(dw), vec(dw_cpu)) < 1e-5);
}
