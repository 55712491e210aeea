// The CUDA RoPE launchers run on the CPU by emulation.h, against the CPU kernels. (One kernel
// source per translation unit: the families share names of internal constants.)
#include "cuda/emulation.h"
//
#include "kernels/cuda/rope.cu"
//
#include "cuda/cuda_test.h"
#include "kernels/cpu/rope.h"

using namespace autosp;
using namespace autosp::cudatest;

TEMPLATE_TEST_CASE("emulated rope launchers match the CPU", "[cuda-emulation][rope]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  const int64_t B = 2, N = 3, S = 5, D = 8;
  std::vector<int64_t> pos{3, 1, 4, 1, 5, 9, 2, 6, 5, 35};
  const auto x = values<T>(naive::random_normal(B * N * S * D, 2300));
  const auto xs = to_storage<T>(x);
  std::vector<T> y(xs.size());
  std::vector<H> r(xs.size());
  cpu::rope_forward<H>(x.data(), pos.data(), r.data(), B, N, S, D, 10000.0);
  cuda::rope_forward<T>(xs.data(), pos.data(), y.data(), B, N, S, D, 10000.0, {}, nullptr);
  check_against<T>(from_storage(y), r);
  cpu::rope_backward<H>(x.data(), pos.data(), r.data(), B, N, S, D, 10000.0);
  cuda::rope_backward<T>(xs.data(), pos.data(), y.data(), B, N, S, D, 10000.0, {}, nullptr);
  check_against<T>(from_storage(y), r);
}

TEMPLATE_TEST_CASE("emulated rope launchers with yarn scaling match the CPU", "[cuda-emulation][rope]", float, double,
                   cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  const int64_t B = 1, N = 2, S = 5, D = 16;
  std::vector<int64_t> pos{3, 1, 4, 17, 35};
  kernels::RopeScaling yarn;
  yarn.kind = kernels::RopeScaling::yarn;
  yarn.factor = 4, yarn.original_max_position_embeddings = 4096, yarn.mscale = 1, yarn.mscale_all_dim = 0.5;
  const auto x = values<T>(naive::random_normal(B * N * S * D, 2301));
  const auto xs = to_storage<T>(x);
  std::vector<T> y(xs.size());
  std::vector<H> r(xs.size());
  cpu::rope_forward<H>(x.data(), pos.data(), r.data(), B, N, S, D, 100.0, yarn);
  cuda::rope_forward<T>(xs.data(), pos.data(), y.data(), B, N, S, D, 100.0, yarn, nullptr);
  check_against<T>(from_storage(y), r);
  cpu::rope_backward<H>(x.data(), pos.data(), r.data(), B, N, S, D, 100.0, yarn);
  cuda::rope_backward<T>(xs.data(), pos.data(), y.data(), B, N, S, D, 100.0, yarn, nullptr);
  check_against<T>(from_storage(y), r);
}
