// CUDA RoPE forward and backward against the CPU kernel: the op-case shape, head dims 64 and 128
// with Llama 3's theta, and late positions (large angles).
#include "cuda/cuda_test.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/rope.cuh"

using namespace autosp;
using namespace autosp::cudatest;

TEMPLATE_TEST_CASE("cuda rope matches the CPU", "[cuda][rope]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  struct Case {
    int64_t B, N, S, D;
    double theta;
    int64_t pos0;  // first position (positions are pos0 + s, reversed in batch 1)
  };
  uint32_t seed = 400;
  for (const Case c :
       {Case{2, 3, 5, 8, 10000.0, 0}, Case{1, 4, 256, 64, 10000.0, 0}, Case{2, 2, 300, 128, 500000.0, 30000}}) {
    INFO("B " << c.B << " N " << c.N << " S " << c.S << " D " << c.D << " pos0 " << c.pos0);
    const int64_t n = c.B * c.N * c.S * c.D;
    std::vector<int64_t> pos(size_t(c.B * c.S));
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t s = 0; s < c.S; ++s) pos[size_t(b * c.S + s)] = c.pos0 + (b == 0 ? s : c.S - 1 - s);
    const auto x = values<T>(naive::random_normal(n, seed++));
    Dev<T> dx(x), dy(static_cast<size_t>(n));
    Dev<int64_t> dpos(pos);
    std::vector<H> y(static_cast<size_t>(n));
    cpu::rope_forward<H>(x.data(), pos.data(), y.data(), c.B, c.N, c.S, c.D, c.theta);
    cuda::rope_forward<T>(dx.get(), dpos.get(), dy.get(), c.B, c.N, c.S, c.D, c.theta, {}, nullptr);
    check_against<T>(dy.download(), y);
    cpu::rope_backward<H>(x.data(), pos.data(), y.data(), c.B, c.N, c.S, c.D, c.theta);
    cuda::rope_backward<T>(dx.get(), dpos.get(), dy.get(), c.B, c.N, c.S, c.D, c.theta, {}, nullptr);
    check_against<T>(dy.download(), y);
  }
}

TEMPLATE_TEST_CASE("cuda rope with rope_scaling matches the CPU", "[cuda][rope]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  const int64_t B = 2, N = 4, S = 64, D = 128;
  std::vector<int64_t> pos(size_t(B * S));
  for (int64_t i = 0; i < B * S; ++i) pos[size_t(i)] = 7919 * i % 20000;
  const auto x = values<T>(naive::random_normal(B * N * S * D, 470));
  Dev<T> dx(x), dy(static_cast<size_t>(B * N * S * D));
  Dev<int64_t> dpos(pos);
  std::vector<H> y(static_cast<size_t>(B * N * S * D));
  for (const cpu::RopeScaling s : {cpu::RopeScaling{cpu::RopeScaling::llama3, 8, 1, 4, 8192},
                                   cpu::RopeScaling{cpu::RopeScaling::linear, 4}}) {
    INFO("kind " << int(s.kind));
    cpu::rope_forward<H>(x.data(), pos.data(), y.data(), B, N, S, D, 500000.0, s);
    cuda::rope_forward<T>(dx.get(), dpos.get(), dy.get(), B, N, S, D, 500000.0, s, nullptr);
    check_against<T>(dy.download(), y);
    cpu::rope_backward<H>(x.data(), pos.data(), y.data(), B, N, S, D, 500000.0, s);
    cuda::rope_backward<T>(dx.get(), dpos.get(), dy.get(), B, N, S, D, 500000.0, s, nullptr);
    check_against<T>(dy.download(), y);
  }
}
