// CUDA flash attention (both kernels: tensor-core bf16 and SIMT) against the CPU flash attention,
// forward (o, lse) and backward (dq, dk, dv; bitwise deterministic): the CPU test table (GQA,
// causal bottom-right with Sq ≠ Skv, rows that see no key, odd head dims, no keys), the op
// cases, and S = 256 / 1024 at D = 64 / 128; attention sinks with windows and documents (dsinks
// too). Also the composite-attention causal mask.
#include <algorithm>
#include <cmath>

#include "cuda/cuda_test.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.cuh"

using namespace autosp;
using namespace autosp::cudatest;

namespace {

struct SdpaCase {
  int64_t B, N, Nkv, Sq, Skv, D;
  bool causal;
  double scale;  // 0: 1/sqrt(D)
  // Variants (causal, Sq = Skv): a window, packed documents of doc_len (0: none), sinks.
  int64_t window = 0, doc_len = 0;
  bool sinks = false;
};

const SdpaCase kSdpaCases[] = {
    // the CPU kernel's table
    {1, 1, 1, 1, 1, 8, false, 0},
    {1, 1, 1, 1, 1, 8, true, 0},
    {2, 2, 2, 7, 7, 16, true, 0},
    {1, 8, 2, 65, 65, 64, true, 0},
    {1, 8, 2, 65, 65, 64, false, 0},
    {2, 4, 4, 130, 130, 16, true, 0},
    {1, 2, 1, 130, 130, 8, false, 0},
    {1, 2, 2, 7, 130, 16, false, 0},
    {2, 4, 2, 65, 7, 64, false, 0},
    {1, 2, 2, 7, 130, 16, true, 0},
    {1, 4, 2, 65, 130, 8, true, 0},
    {1, 2, 1, 130, 65, 16, true, 0},
    {1, 3, 3, 33, 70, 3, true, 0},
    {1, 2, 2, 66, 129, 100, false, 0},
    {1, 2, 2, 200, 200, 128, true, 0},
    {1, 2, 1, 65, 65, 16, true, 2.0},
    {1, 1, 1, 3, 0, 8, false, 0},
    // the op cases
    {2, 4, 2, 5, 5, 8, true, 0.3},
    {2, 2, 2, 5, 7, 4, false, 0.5},
    // tensor-core shapes: partial tiles, Sq ≠ Skv, GQA, long sequences
    {1, 4, 2, 100, 300, 64, true, 0},
    {1, 2, 2, 300, 100, 128, true, 0},
    {1, 8, 2, 256, 256, 64, true, 0},
    {2, 4, 4, 256, 256, 128, false, 0},
    {1, 4, 1, 1024, 1024, 64, true, 0},
    {1, 8, 8, 1024, 1024, 128, true, 0},
};

// Attention sinks (gpt-oss: GQA, D 64, a window of 128 on every other layer) with a window, packed
// documents or neither: forward, and backward with dsinks, against the CPU flash kernel with the
// same sinks (itself checked against a float64 eager attention in
// tests/kernels/test_attention_variants.cpp). tests/cuda/emulate_attention.cpp checks the same
// kernels at small sizes without a GPU.
const SdpaCase kSinkCases[] = {
    {1, 8, 2, 1024, 1024, 64, true, 0, 128, 0, true},  // gpt-oss's sliding layers (tensor cores in bf16)
    {1, 8, 1, 700, 700, 64, true, 0, 0, 0, true},      // its full layers, partial tiles
    {2, 4, 2, 600, 600, 128, true, 0, 0, 190, true},   // packed documents, D 128
    {1, 3, 1, 77, 77, 16, true, 0, 20, 30, true},      // SIMT only: window and documents together
};

template <class T>
void check_sdpa(const SdpaCase& c, cuda::SdpaKernel kernel, uint32_t seed) {
  using H = Host<T>;
  INFO("B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " Sq " << c.Sq << " Skv " << c.Skv << " D " << c.D
            << " causal " << c.causal << " scale " << c.scale << " window " << c.window << " documents " << c.doc_len
            << " sinks " << c.sinks << " kernel " << (kernel == cuda::SdpaKernel::simt ? "simt" : "automatic"));
  const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
  const int64_t nq = c.B * c.N * c.Sq * c.D, nkv = c.B * c.Nkv * c.Skv * c.D, nl = c.B * c.N * c.Sq;
  const auto q = values<T>(naive::random_normal(nq, seed)), k = values<T>(naive::random_normal(nkv, seed + 1));
  const auto v = values<T>(naive::random_normal(nkv, seed + 2)), dout = values<T>(naive::random_normal(nq, seed + 3));
  // The variant: sinks as bf16 values for a bf16 model (the kernels read them in f32), documents
  // of doc_len with the first 13 tokens shorter.
  const std::vector<float> sinks = values<T>(c.sinks ? around(2.0, c.N, seed + 4, 3.0) : naive::Vec());
  std::vector<int64_t> starts(static_cast<size_t>(c.doc_len > 0 ? c.B * c.Sq : 0));
  for (size_t r = 0; r < starts.size(); ++r)
    starts[r] = std::max<int64_t>(0, (int64_t(r) % c.Sq + 13) / c.doc_len * c.doc_len - 13);
  std::vector<float> dsinks_ref(static_cast<size_t>(c.N));
  const AttentionVariant<float> host_var{.window = c.window,
                                         .sinks = c.sinks ? sinks.data() : nullptr,
                                         .dsinks = c.sinks ? dsinks_ref.data() : nullptr};
  const int64_t* host_starts = c.doc_len > 0 ? starts.data() : nullptr;

  std::vector<H> o(static_cast<size_t>(nq)), lse(static_cast<size_t>(nl));
  cpu::sdpa_forward<H>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale,
                       c.causal, host_starts, host_var);
  Dev<T> dq_(q), dk_(k), dv_(v), ddout(dout), dout_o(static_cast<size_t>(nq));
  Dev<float> dlse(static_cast<size_t>(nl)), dsinks(sinks), dds(static_cast<size_t>(c.N)), dds2(static_cast<size_t>(c.N));
  Dev<int64_t> dstarts(starts);
  AttentionVariant<float> var{.window = c.window, .sinks = dsinks.get(), .dsinks = c.sinks ? dds.get() : nullptr};
  cuda::sdpa_forward<T>(dq_.get(), dk_.get(), dv_.get(), dout_o.get(), dlse.get(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D,
                        scale, c.causal, nullptr, kernel, dstarts.get(), var);
  check_against<T>(dout_o.download(), o);
  const auto got_lse = dlse.download();
  check_against<T>(std::vector<H>(got_lse.begin(), got_lse.end()), lse);

  // The backward reads o as the forward stored it (rounded to T), as training does.
  const auto o_t = values<T>(widen(o));
  std::vector<H> gq(static_cast<size_t>(nq)), gk(static_cast<size_t>(nkv)), gv(static_cast<size_t>(nkv));
  cpu::sdpa_backward<H>(q.data(), k.data(), v.data(), o_t.data(), lse.data(), dout.data(), gq.data(), gk.data(),
                        gv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, host_starts, nullptr, host_var);
  // dv = Pᵀ·dout sums over the queries: its Σ|term| is Pᵀ·|dout| (P ≥ 0), the same backward's dv
  // with |dout| (its dq, dk and dsinks are not used).
  std::vector<H> mq(static_cast<size_t>(nq)), mk(static_cast<size_t>(nkv)), mv(static_cast<size_t>(nkv));
  const auto abs_dout = absolute(dout);
  AttentionVariant<float> abs_var = host_var;
  abs_var.dsinks = nullptr;
  cpu::sdpa_backward<H>(q.data(), k.data(), v.data(), o_t.data(), lse.data(), abs_dout.data(), mq.data(), mk.data(),
                        mv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, host_starts, nullptr, abs_var);
  Dev<T> dgq(static_cast<size_t>(nq)), dgk(static_cast<size_t>(nkv)), dgv(static_cast<size_t>(nkv)),
      dgq2(static_cast<size_t>(nq)), dgk2(static_cast<size_t>(nkv)), dgv2(static_cast<size_t>(nkv));
  cuda::sdpa_backward<T>(dq_.get(), dk_.get(), dv_.get(), dout_o.get(), dlse.get(), ddout.get(), dgq.get(), dgk.get(),
                         dgv.get(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, nullptr, kernel, dstarts.get(),
                         var);
  if (c.sinks) var.dsinks = dds2.get();
  cuda::sdpa_backward<T>(dq_.get(), dk_.get(), dv_.get(), dout_o.get(), dlse.get(), ddout.get(), dgq2.get(), dgk2.get(),
                         dgv2.get(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, nullptr, kernel, dstarts.get(),
                         var);
  const auto got_q = dgq.download(), got_k = dgk.download(), got_v = dgv.download();
  {
    INFO("dq");
    check_against<T>(got_q, gq);
  }
  {
    INFO("dk");
    check_against<T>(got_k, gk);
  }
  {
    INFO("dv");
    check_sum_against<T>(got_v, gv, mv);
  }
  check_identical(got_q, dgq2.download());
  check_identical(got_k, dgk2.download());
  check_identical(got_v, dgv2.download());
  if (c.sinks) {
    INFO("dsinks (a sum over B·S rows: f32 on the device, double on the CPU)");
    const auto got_s = dds.download();
    check_against<T>(got_s, dsinks_ref, std::is_same_v<T, float> ? 1e-4 : 2e-2);
    check_identical(got_s, dds2.download());
  }
}

}  // namespace

TEST_CASE("cuda sdpa with sinks matches the CPU", "[cuda][attention][sinks]") {
  uint32_t seed = 1900;
  for (const SdpaCase& c : kSinkCases) {
    check_sdpa<float>(c, cuda::SdpaKernel::automatic, seed += 5);
    check_sdpa<cuda::bf16>(c, cuda::SdpaKernel::automatic, seed += 5);
    check_sdpa<cuda::bf16>(c, cuda::SdpaKernel::simt, seed += 5);
  }
}

TEST_CASE("cuda sdpa f32 matches the CPU", "[cuda][attention]") {
  uint32_t seed = 800;
  for (const SdpaCase& c : kSdpaCases) check_sdpa<float>(c, cuda::SdpaKernel::automatic, seed += 4);
}

TEST_CASE("cuda sdpa bf16 (tensor cores where they apply) matches the CPU", "[cuda][attention]") {
  uint32_t seed = 900;
  for (const SdpaCase& c : kSdpaCases) check_sdpa<cuda::bf16>(c, cuda::SdpaKernel::automatic, seed += 4);
}

TEST_CASE("cuda sdpa bf16 SIMT kernels match the CPU", "[cuda][attention]") {
  uint32_t seed = 1000;
  for (const SdpaCase& c : kSdpaCases) check_sdpa<cuda::bf16>(c, cuda::SdpaKernel::simt, seed += 4);
}

TEMPLATE_TEST_CASE("cuda causal_mask matches the CPU", "[cuda][attention]", float, double, cuda::bf16) {
  using T = TestType;
  using H = Host<T>;
  struct Case {
    int64_t batch, Sq, Skv;
  };
  for (const Case c : {Case{6, 5, 7}, Case{2, 130, 65}, Case{3, 64, 64}}) {
    const int64_t n = c.batch * c.Sq * c.Skv;
    const auto x = values<T>(naive::random_normal(n, 1100));
    std::vector<H> y(static_cast<size_t>(n));
    cpu::causal_mask<H>(x.data(), y.data(), c.batch, c.Sq, c.Skv, H(-7));
    Dev<T> dx(x), dy(static_cast<size_t>(n));
    T value;
    if constexpr (std::is_same_v<T, cuda::bf16>)
      value = bf16_from_bits(cpu::f32_to_bf16(-7.f));
    else
      value = T(-7);
    cuda::causal_mask<T>(dx.get(), dy.get(), c.batch, c.Sq, c.Skv, value, nullptr);
    check_identical(dy.download(), y);
    cuda::causal_mask<T>(dx.get(), dx.get(), c.batch, c.Sq, c.Skv, value, nullptr);  // in place
    check_identical(dx.download(), y);
  }
}
