// The CUDA grouped expert MLP (kernels/cuda/moe.cu) run on the CPU by emulation.h, against the
// naive per-token loop of tests/common/naive.h: host routing, the gather, weight-gradient and
// activation and scatter kernels on the emulated GEMMs, forward, and the backward's dx, dprobs and
// weight gradients against the CPU kernel (kernels/cpu/moe.h), in f32; gpt-oss's experts (biases,
// the clamped SwiGLU) in f32 and f64, the forward against the naive float64 loop.
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

namespace {

// gpt-oss's experts (per-expert biases, the clamped SwiGLU with a limit the data cross) in T, as
// raw arrays with per-expert pointers, the way the launchers pass them.
template <class T>
struct GptOssExperts {
  static constexpr int64_t R = 37, C = 8, E = 4, I = 6, k = 2;
  static constexpr double kLimit = 0.75, kAlpha = 1.702;
  // Each expert's elements of gate, up, down, b_gate, b_up, b_down.
  static constexpr int64_t kSizes[6] = {I * C, I * C, C * I, I, I, C};
  naive::Vec x, dy, probs, w[6];  // w: gate, up [E, I, C]; down [E, C, I]; b_gate, b_up [E, I]; b_down [E, C]
  std::vector<T> xt, dyt, pt, wt[6];
  std::vector<const T*> wp[6];
  GptOssExperts() {
    x = naive::random_normal(R * C, 5200), dy = naive::random_normal(R * C, 5201);
    probs = naive::softmax(naive::random_normal(R * E, 5202), R, E);
    for (int i = 0; i < 6; ++i) {
      w[i] = naive::random_normal(E * kSizes[i], 5203 + i, 0.5);
      wt[i].assign(w[i].begin(), w[i].end());
      for (int64_t e = 0; e < E; ++e) wp[i].push_back(wt[i].data() + e * kSizes[i]);
    }
    xt.assign(x.begin(), x.end()), dyt.assign(dy.begin(), dy.end()), pt.assign(probs.begin(), probs.end());
  }
  kernels::MoeOptions<T> options() const {
    return {.b_gate = wp[3].data(), .b_up = wp[4].data(), .b_down = wp[5].data(), .clamped = true, .alpha = kAlpha,
            .limit = kLimit};
  }
  // The gradients' storage (weights then biases, per expert) and its per-expert pointers.
  struct Grads {
    std::vector<T> dx = std::vector<T>(size_t(R * C)), dp = std::vector<T>(size_t(R * E)), all;
    std::vector<T*> p[6];
    Grads() {
      int64_t total = 0;
      for (int64_t s : kSizes) total += E * s;
      all.assign(size_t(total), T(-7));  // garbage: every gradient must be written
      T* at = all.data();
      for (int i = 0; i < 6; ++i)
        for (int64_t e = 0; e < E; ++e, at += kSizes[i]) p[i].push_back(at);
    }
    kernels::MoeOptions<T> options(const kernels::MoeOptions<T>& o) {
      kernels::MoeOptions<T> r = o;
      r.db_gate = p[3].data(), r.db_up = p[4].data(), r.db_down = p[5].data();
      return r;
    }
  };
};

template <class T>
naive::Vec doubles(const std::vector<T>& v) {
  return naive::Vec(v.begin(), v.end());
}

}  // namespace

TEMPLATE_TEST_CASE("emulated gpt-oss experts (biases, clamped SwiGLU) match the naive loop, and their backward the "
                   "CPU kernel",
                   "[cuda-emulation][moe]", float, double) {
  using T = TestType;
  using M = GptOssExperts<T>;
  const M m;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  std::vector<T> y(size_t(M::R * M::C), T(-7));
  cuda::moe_experts_forward<T>(m.xt.data(), m.pt.data(), m.wp[0].data(), m.wp[1].data(), m.wp[2].data(), y.data(), M::R,
                               M::C, M::E, M::I, M::k, true, m.options(), nullptr);
  const naive::Vec want = naive::gpt_oss_experts(m.x, m.probs, m.w[0], m.w[1], m.w[2], m.w[3], m.w[4], m.w[5], M::R,
                                                 M::C, M::E, M::I, M::k, true, M::kAlpha, M::kLimit);
  CHECK(relative_l2(doubles(y), want) < tol);
  // The clamps bite: without them the forward is another function.
  kernels::MoeOptions<T> unclamped = m.options();
  unclamped.limit = 1e9;
  std::vector<T> y_free(y.size());
  cuda::moe_experts_forward<T>(m.xt.data(), m.pt.data(), m.wp[0].data(), m.wp[1].data(), m.wp[2].data(), y_free.data(),
                               M::R, M::C, M::E, M::I, M::k, true, unclamped, nullptr);
  CHECK(relative_l2(doubles(y_free), want) > 1e-2);

  typename M::Grads gpu, cpu;
  const auto og = gpu.options(m.options()), oc = cpu.options(m.options());
  cuda::moe_experts_backward<T>(m.dyt.data(), m.xt.data(), m.pt.data(), m.wp[0].data(), m.wp[1].data(), m.wp[2].data(),
                                gpu.dx.data(), gpu.dp.data(), gpu.p[0].data(), gpu.p[1].data(), gpu.p[2].data(), M::R,
                                M::C, M::E, M::I, M::k, true, og, nullptr);
  cpu::moe_experts_backward<T>(m.dyt.data(), m.xt.data(), m.pt.data(), m.wp[0].data(), m.wp[1].data(), m.wp[2].data(),
                               cpu.dx.data(), cpu.dp.data(), cpu.p[0].data(), cpu.p[1].data(), cpu.p[2].data(), M::R, M::C,
                               M::E, M::I, M::k, true, oc);
  CHECK(relative_l2(doubles(gpu.dx), doubles(cpu.dx)) < tol);
  CHECK(relative_l2(doubles(gpu.dp), doubles(cpu.dp)) < tol);
  const char* names[6] = {"dw_gate", "dw_up", "dw_down", "db_gate", "db_up", "db_down"};
  for (int i = 0; i < 6; ++i) {
    INFO(names[i]);
    naive::Vec a, b;
    for (int64_t e = 0; e < M::E; ++e)
      for (int64_t j = 0; j < M::kSizes[i]; ++j) a.push_back(double(gpu.p[i][e][j])), b.push_back(double(cpu.p[i][e][j]));
    CHECK(relative_l2(a, b) < tol);
  }
}
