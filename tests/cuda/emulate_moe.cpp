// The CUDA grouped expert MLP (kernels/cuda/moe.cu) run on the CPU by emulation.h, against the
// naive per-token loop of tests/common/naive.h: host routing, the gather, weight-gradient and
// activation and scatter kernels on the emulated GEMMs, forward, and the backward's dx, dprobs and
// weight gradients against the CPU kernel (kernels/cpu/moe.h), in f32; gpt-oss's experts (biases,
// the clamped SwiGLU) in f32 and f64, the forward against the naive float64 loop. And expert
// parallelism's exchange on device buffers (engine/cuda/expert_parallel.cpp) on thread ranks, its
// forward and every gradient against the one-process kernel and the CPU exchange.
//
// The expert-parallel cases are compiled only where the build has no CUDA (the sanitizer stage's
// build, a CPU-only build): their thread ranks (comm/threads.cpp) copy through the device runtime,
// which in a CUDA build links the real CUDA helpers (kernels/cuda/common.cu), whose Scratch
// collides with the emulation's (tests/cuda/emulation.cpp) at link time.
#include "cuda/emulation.h"
//
#include "kernels/cuda/moe.cu"
//
#ifndef AUTOSP_WITH_CUDA
#include "engine/cuda/expert_parallel.cpp"
//
#include "comm/counting.h"
#include "comm/threads.h"
#include "engine/expert_parallel.h"
#endif
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

// ---- expert parallelism on device buffers (engine/cuda/expert_parallel.h) ----
#ifndef AUTOSP_WITH_CUDA

namespace {

// One MoE layer's inputs over G ranks of Rg rows each: x, dy [G·Rg, C], probs [G·Rg, E], and every
// expert's parameters (params[which · E + e], which: gate, up, down and, for gpt-oss's experts,
// b_gate, b_up, b_down). Uneven: rank 0's rows choose only experts 0 and 1 (so rank 0 sends
// nothing to the ranks holding experts 2 and 3) and no row chooses expert 3 (its owner receives
// nothing, and its gradients are zeros).
struct EpCase {
  static constexpr int64_t C = 8, E = 4, I = 6, k = 2;
  static constexpr double kAlpha = 1.702, kLimit = 0.75;
  int64_t R = 0;
  bool gptoss = false;
  naive::Vec x, dy, probs;
  std::vector<naive::Vec> params;
  static int64_t size(int which) { return which < 3 ? I * C : which < 5 ? I : C; }
  int weights() const { return gptoss ? 6 : 3; }
  EpCase(int64_t rows, int rank0_rows, bool gpt_oss, bool uneven) : R(rows), gptoss(gpt_oss) {
    x = naive::random_normal(R * C, 5300), dy = naive::random_normal(R * C, 5301);
    naive::Vec logits = naive::random_normal(R * E, 5302);
    if (uneven)
      for (int64_t r = 0; r < R; ++r) {
        logits[size_t(r * E + 3)] -= 30;
        if (r < rank0_rows) logits[size_t(r * E + 2)] -= 30;
      }
    probs = naive::softmax(logits, R, E);
    for (int which = 0; which < weights(); ++which)
      for (int64_t e = 0; e < E; ++e)
        params.push_back(naive::random_normal(size(which), 5310 + uint32_t(which * E + e), 0.5));
  }
};

template <class T>
T to_t(double v) {
  if constexpr (std::is_same_v<T, cuda::bf16>)
    return __double2bfloat16(v);
  else
    return T(v);
}
template <class T>
double from_t(T v) {
  if constexpr (std::is_same_v<T, cuda::bf16>)
    return double(__bfloat162float(v));
  else
    return double(v);
}
template <class T>
std::vector<T> to_ts(const double* v, int64_t n) {
  std::vector<T> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[size_t(i)] = to_t<T>(v[i]);
  return r;
}
template <class T>
naive::Vec from_ts(const std::vector<T>& v) {
  naive::Vec r;
  for (const T& a : v) r.push_back(from_t(a));
  return r;
}

// Experts [e0, e0 + n) of a case in T, with their gradients (garbage before: each must be written)
// and the pointer arrays and options the kernels take.
template <class T>
struct ExpertSet {
  std::vector<std::vector<T>> w, g;  // [which · n + j]
  std::vector<const T*> wp[6];
  std::vector<T*> gp[6];
  kernels::MoeOptions<T> opt;
  ExpertSet(const EpCase& c, int64_t e0, int64_t n) {
    for (int which = 0; which < c.weights(); ++which)
      for (int64_t e = e0; e < e0 + n; ++e) {
        w.push_back(to_ts<T>(c.params[size_t(which * c.E + e)].data(), EpCase::size(which)));
        g.push_back(std::vector<T>(size_t(EpCase::size(which)), to_t<T>(-7)));
      }
    for (int which = 0; which < c.weights(); ++which)
      for (int64_t j = 0; j < n; ++j) {
        wp[which].push_back(w[size_t(which * n + j)].data());
        gp[which].push_back(g[size_t(which * n + j)].data());
      }
    if (c.gptoss) {
      opt.b_gate = wp[3].data(), opt.b_up = wp[4].data(), opt.b_down = wp[5].data();
      opt.db_gate = gp[3].data(), opt.db_up = gp[4].data(), opt.db_down = gp[5].data();
      opt.clamped = true, opt.alpha = EpCase::kAlpha, opt.limit = EpCase::kLimit;
    }
  }
};

// One run's outputs on a rank: y, dx, dprobs and its experts' gradients.
template <class T>
struct EpOut {
  std::vector<T> y, dx, dp;
  std::vector<std::vector<T>> g;
  int64_t forward_all_to_alls = 0, backward_all_to_alls = 0;  // the exchange's messages each way and back
};

// The layer on G thread ranks (rank g: rows [g·Rg, (g+1)·Rg), experts [g·L, (g+1)·L)) through the
// CUDA exchange and, where `cpu` (f32, f64), through the CPU exchange on the same ranks.
template <class T>
void run_ep(const EpCase& c, int G, std::vector<EpOut<T>>& dev, std::vector<EpOut<T>>& cpu_out, bool cpu) {
  const int64_t Rg = c.R / G, L = c.E / G, C = c.C, E = c.E, I = c.I, k = c.k;
  dev.assign(size_t(G), {}), cpu_out.assign(size_t(G), {});
  run_thread_ranks(G, [&](ThreadCommunicator& comm) {
    const int g = comm.rank();
    const std::vector<T> x = to_ts<T>(c.x.data() + g * Rg * C, Rg * C), dy = to_ts<T>(c.dy.data() + g * Rg * C, Rg * C),
                         p = to_ts<T>(c.probs.data() + g * Rg * E, Rg * E);
    auto one = [&](EpOut<T>& out, bool on_device) {
      CountingCommunicator counted(comm);
      Communicator& ep = counted;
      const auto all_to_alls = [&] {
        const int64_t n = counted.stats().all_to_all.calls;
        counted.reset_stats();
        return n;
      };
      ExpertSet<T> m(c, g * L, L);
      out.y.assign(size_t(Rg * C), to_t<T>(-7)), out.dx = out.y, out.dp.assign(size_t(Rg * E), to_t<T>(-7));
      if (on_device) {
        cuda::moe_ep_forward<T>(ep, cpu_allocator(), x.data(), p.data(), m.wp[0].data(), m.wp[1].data(),
                                m.wp[2].data(), out.y.data(), Rg, C, E, I, k, true, m.opt, nullptr);
        out.forward_all_to_alls = all_to_alls();
        cuda::moe_ep_backward<T>(ep, cpu_allocator(), dy.data(), x.data(), p.data(), m.wp[0].data(), m.wp[1].data(),
                                 m.wp[2].data(), out.dx.data(), out.dp.data(), m.gp[0].data(), m.gp[1].data(),
                                 m.gp[2].data(), Rg, C, E, I, k, true, m.opt, nullptr);
        out.backward_all_to_alls = all_to_alls();
      } else if constexpr (!std::is_same_v<T, cuda::bf16>) {
        moe_ep_forward<T>(ep, cpu_allocator(), x.data(), p.data(), m.wp[0].data(), m.wp[1].data(), m.wp[2].data(),
                          out.y.data(), Rg, C, E, I, k, true, m.opt);
        out.forward_all_to_alls = all_to_alls();
        moe_ep_backward<T>(ep, cpu_allocator(), dy.data(), x.data(), p.data(), m.wp[0].data(), m.wp[1].data(),
                           m.wp[2].data(), out.dx.data(), out.dp.data(), m.gp[0].data(), m.gp[1].data(),
                           m.gp[2].data(), Rg, C, E, I, k, true, m.opt);
        out.backward_all_to_alls = all_to_alls();
      }
      out.g = m.g;
    };
    one(dev[size_t(g)], true);
    if (cpu) one(cpu_out[size_t(g)], false);
  });
}

// The one-process CUDA kernel (emulated) on every row and expert.
template <class T>
EpOut<T> run_one(const EpCase& c) {
  const int64_t R = c.R, C = c.C, E = c.E, I = c.I, k = c.k;
  const std::vector<T> x = to_ts<T>(c.x.data(), R * C), dy = to_ts<T>(c.dy.data(), R * C),
                       p = to_ts<T>(c.probs.data(), R * E);
  ExpertSet<T> m(c, 0, E);
  EpOut<T> out;
  out.y.resize(size_t(R * C)), out.dx.resize(size_t(R * C)), out.dp.resize(size_t(R * E));
  cuda::moe_experts_forward<T>(x.data(), p.data(), m.wp[0].data(), m.wp[1].data(), m.wp[2].data(), out.y.data(), R, C,
                               E, I, k, true, m.opt, nullptr);
  cuda::moe_experts_backward<T>(dy.data(), x.data(), p.data(), m.wp[0].data(), m.wp[1].data(), m.wp[2].data(),
                                out.dx.data(), out.dp.data(), m.gp[0].data(), m.gp[1].data(), m.gp[2].data(), R, C, E,
                                I, k, true, m.opt, nullptr);
  out.g = m.g;
  return out;
}

// The largest |a - b| / (1 + |b|) over a slice.
template <class T>
double worst(const std::vector<T>& a, const std::vector<T>& b, int64_t b0, int64_t n) {
  double w = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double got = from_t(a[size_t(i)]), want = from_t(b[size_t(b0 + i)]);
    w = std::max(w, std::abs(got - want) / (1 + std::abs(want)));
  }
  return w;
}

// Every rank's y, dx, dprobs slices and its experts' gradients against `ref`: the one process
// (expert e of rank g is ref's expert g·L + j), or another EP run on the same ranks (`same_ranks`).
template <class T>
void check_ranks(const EpCase& c, int G, const std::vector<EpOut<T>>& got, const std::vector<EpOut<T>>* ranks,
                 const EpOut<T>* one, double tol) {
  const int64_t Rg = c.R / G, L = c.E / G;
  for (int g = 0; g < G; ++g) {
    INFO("G = " << G << ", rank " << g << (ranks ? " against the CPU exchange" : " against one process"));
    const EpOut<T>& o = got[size_t(g)];
    const EpOut<T>& r = ranks ? (*ranks)[size_t(g)] : *one;
    const int64_t row0 = ranks ? 0 : g * Rg;
    CHECK(worst(o.y, r.y, row0 * c.C, Rg * c.C) < tol);
    CHECK(worst(o.dx, r.dx, row0 * c.C, Rg * c.C) < tol);
    CHECK(worst(o.dp, r.dp, row0 * c.E, Rg * c.E) < tol);
    for (int which = 0; which < c.weights(); ++which)
      for (int64_t j = 0; j < L; ++j) {
        INFO("parameter " << which << " of expert " << g * L + j);
        const std::vector<T>& want = ranks ? r.g[size_t(which * L + j)] : r.g[size_t(which * c.E + g * L + j)];
        CHECK(worst(o.g[size_t(which * L + j)], want, 0, int64_t(want.size())) < tol);
      }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("emulated expert parallelism on device buffers equals one process and the CPU exchange",
                   "[cuda-emulation][moe][ep]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 2e-5;
  for (const bool gptoss : {false, true})
    for (const bool uneven : {false, true})
      for (const int G : {2, 4}) {
        INFO((gptoss ? "gpt-oss" : "Mixtral") << " experts, " << (uneven ? "uneven" : "random") << " routing");
        const int64_t Rg = 7;
        const EpCase c(G * Rg, int(Rg), gptoss, uneven);
        if (uneven) {  // the premise: expert 3 gets no row, and rank 0's rows only experts 0 and 1
          const kernels::MoeRouting r = kernels::moe_route(c.probs.data(), c.R, c.E, c.k, true);
          CHECK(r.rows_of(3) == 0);
          for (int64_t s = 0; s < Rg * c.k; ++s) CHECK(r.expert[size_t(s)] < 2);
        }
        const EpOut<T> one = run_one<T>(c);
        std::vector<EpOut<T>> dev, cpu;
        run_ep<T>(c, G, dev, cpu, true);
        check_ranks<T>(c, G, dev, nullptr, &one, tol);
        check_ranks<T>(c, G, dev, &cpu, nullptr, tol);
        for (int g = 0; g < G; ++g) {  // one message out and one back each way, as the layout search prices
          INFO("rank " << g);
          CHECK(dev[size_t(g)].forward_all_to_alls == 2);
          CHECK(dev[size_t(g)].backward_all_to_alls == 2);
          CHECK(cpu[size_t(g)].forward_all_to_alls == 2);
          CHECK(cpu[size_t(g)].backward_all_to_alls == 2);
        }
        if (uneven) {  // expert 3 received nothing: its gradients are zeros (not the garbage they held)
          const EpOut<T>& owner = dev[size_t(G - 1)];
          const int64_t L = c.E / G;
          for (int which = 0; which < c.weights(); ++which)
            for (const T& v : owner.g[size_t(which * L + L - 1)]) CHECK(from_t(v) == 0.0);
        }
      }
}

TEST_CASE("emulated expert parallelism in bf16 stays within bf16 rounding of one process", "[cuda-emulation][moe][ep]") {
  for (const bool gptoss : {false, true}) {
    INFO((gptoss ? "gpt-oss" : "Mixtral") << " experts");
    const int G = 2;
    const EpCase c(G * 7, 7, gptoss, true);
    const EpOut<cuda::bf16> one = run_one<cuda::bf16>(c);
    std::vector<EpOut<cuda::bf16>> dev, unused;
    run_ep<cuda::bf16>(c, G, dev, unused, false);
    check_ranks<cuda::bf16>(c, G, dev, nullptr, &one, 2e-2);
    for (int g = 0; g < G; ++g) CHECK(dev[size_t(g)].backward_all_to_alls == 2);  // bf16 rows with f32 weights
  }
}
#endif  // AUTOSP_WITH_CUDA
