// cuDNN SDPA (kernels/cuda/cudnn_attention.cuh) against the CPU flash attention, bf16 within 1e-2
// (|cudnn - cpu| ≤ 1e-2 · (1 + |cpu|)): forward o and lse (cuDNN's Stats must be our log-sum-exp),
// backward dq, dk, dv; causal and not, GQA, D = 64 and 128, lengths that are not tile multiples,
// Sq ≠ Skv without causal. Also: a forward of one implementation feeds the backward of the other,
// and the support check names what it refuses.
#include <cmath>

#include "cuda/cuda_test.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cudnn_attention.cuh"

using namespace autosp;
using namespace autosp::cudatest;

namespace {

struct Case {
  int64_t B, N, Nkv, Sq, Skv, D;
  bool causal;
};

const Case kCases[] = {
    {1, 2, 2, 128, 128, 64, false},  {1, 2, 2, 128, 128, 64, true},   {2, 4, 2, 200, 200, 64, true},
    {1, 8, 2, 256, 256, 128, true},  {1, 4, 1, 130, 130, 128, false}, {2, 2, 2, 100, 300, 64, false},
    {1, 4, 4, 1024, 1024, 128, true}, {1, 8, 8, 333, 333, 128, true},
};

void check_case(const Case& c, uint32_t seed) {
  using T = cuda::bf16;
  using H = float;
  INFO("B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " Sq " << c.Sq << " Skv " << c.Skv << " D " << c.D
            << " causal " << c.causal);
  const std::string why = cuda::cudnn_sdpa_unsupported<T>(c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, c.causal);
  INFO("unsupported: " << why);
  REQUIRE(why.empty());
  const double scale = 1.0 / std::sqrt(double(c.D));
  const int64_t nq = c.B * c.N * c.Sq * c.D, nkv = c.B * c.Nkv * c.Skv * c.D, nl = c.B * c.N * c.Sq;
  const auto q = values<T>(naive::random_normal(nq, seed)), k = values<T>(naive::random_normal(nkv, seed + 1));
  const auto v = values<T>(naive::random_normal(nkv, seed + 2)), dout = values<T>(naive::random_normal(nq, seed + 3));

  std::vector<H> o(static_cast<size_t>(nq)), lse(static_cast<size_t>(nl));
  cpu::sdpa_forward<H>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale,
                       c.causal);
  Dev<T> dq_(q), dk_(k), dv_(v), ddout(dout), d_o(static_cast<size_t>(nq));
  Dev<float> dlse(static_cast<size_t>(nl));
  cuda::cudnn_sdpa_forward<T>(dq_.get(), dk_.get(), dv_.get(), d_o.get(), dlse.get(), c.B, c.N, c.Nkv, c.Sq, c.Skv,
                              c.D, scale, c.causal, nullptr);
  {
    INFO("o");
    check_against<T>(d_o.download(), o);
  }
  {
    INFO("lse (cuDNN Stats)");
    check_against<T>(dlse.download(), lse, 1e-3);
  }

  // Backward from the CPU forward's o (rounded to bf16) and lse, as test_attention does.
  const auto o_t = values<T>(widen(o));
  std::vector<H> gq(static_cast<size_t>(nq)), gk(static_cast<size_t>(nkv)), gv(static_cast<size_t>(nkv));
  cpu::sdpa_backward<H>(q.data(), k.data(), v.data(), o_t.data(), lse.data(), dout.data(), gq.data(), gk.data(),
                        gv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal);
  // dv = Pᵀ·dout sums over the queries: its Σ|term| is Pᵀ·|dout| (P ≥ 0), the same backward's dv
  // with |dout| (its dq and dk are not used).
  std::vector<H> mq(static_cast<size_t>(nq)), mk(static_cast<size_t>(nkv)), mv(static_cast<size_t>(nkv));
  const auto abs_dout = absolute(dout);
  cpu::sdpa_backward<H>(q.data(), k.data(), v.data(), o_t.data(), lse.data(), abs_dout.data(), mq.data(), mk.data(),
                        mv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal);
  Dev<T> d_ot(o_t), dgq(static_cast<size_t>(nq)), dgk(static_cast<size_t>(nkv)), dgv(static_cast<size_t>(nkv));
  Dev<float> dlse_cpu(lse);
  cuda::cudnn_sdpa_backward<T>(dq_.get(), dk_.get(), dv_.get(), d_ot.get(), dlse_cpu.get(), ddout.get(), dgq.get(),
                               dgk.get(), dgv.get(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, nullptr);
  {
    INFO("dq");
    check_against<T>(dgq.download(), gq);
  }
  {
    INFO("dk");
    check_against<T>(dgk.download(), gk);
  }
  {
    INFO("dv");
    check_sum_against<T>(dgv.download(), gv, mv);
  }

  // Interchangeable: our backward from cuDNN's forward (o, lse) matches the CPU too.
  Dev<T> fq(static_cast<size_t>(nq)), fk(static_cast<size_t>(nkv)), fv(static_cast<size_t>(nkv));
  cuda::sdpa_backward<T>(dq_.get(), dk_.get(), dv_.get(), d_o.get(), dlse.get(), ddout.get(), fq.get(), fk.get(),
                         fv.get(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, nullptr);
  {
    INFO("flash backward of the cuDNN forward: dq");
    check_against<T>(fq.download(), gq);
  }
}

}  // namespace

TEST_CASE("cudnn sdpa bf16 matches the CPU", "[cuda][attention][cudnn]") {
  if (cuda::cudnn_runtime_version() == 0) {
    WARN("this build has no cuDNN");
    return;
  }
  uint32_t seed = 1300;
  for (const Case& c : kCases) check_case(c, seed += 4);
}

TEST_CASE("cudnn sdpa says what it does not support", "[cuda][attention][cudnn]") {
  CHECK_THAT(cuda::cudnn_sdpa_unsupported<float>(1, 2, 2, 64, 64, 64, false), Catch::Contains("bf16 or f16"));
  if (cuda::cudnn_runtime_version() == 0) return;
  CHECK_THAT(cuda::cudnn_sdpa_unsupported<cuda::bf16>(1, 2, 2, 64, 64, 100, false), Catch::Contains("head dim 100"));
  CHECK_THAT(cuda::cudnn_sdpa_unsupported<cuda::bf16>(1, 3, 2, 64, 64, 64, false), Catch::Contains("do not group"));
  CHECK_THAT(cuda::cudnn_sdpa_unsupported<cuda::bf16>(1, 2, 2, 32, 64, 64, true), Catch::Contains("top-left"));
  CHECK(cuda::cudnn_sdpa_unsupported<cuda::bf16>(1, 2, 2, 32, 64, 64, false).empty());
  CHECK(cuda::cudnn_sdpa_unsupported<cuda::f16>(2, 8, 2, 512, 512, 128, true).empty());
}
