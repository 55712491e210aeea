// The CPU grouped expert MLP on bf16 (kernels/cpu/moe_bf16.h): per expert, chunks of its rows
// gathered as bf16, the GEMMs on the bf16 GEMM path, the SwiGLU and its gradient in f32
// (elementwise.h's vectorised kernels), the per-token sums and the weight gradients in f32.
#include "kernels/cpu/moe_bf16.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/kinds.h"
#include "kernels/moe_routing.h"
#include "tensor/check.h"
#include "tensor/convert.h"

namespace autosp::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;  // elements below which the row loops stay serial

// C [M, N] (f32) = op(A) · op(B) + beta · C over bf16 A, B.
void gemm16(Bf16Gemm path, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* a, const uint16_t* b,
            float beta, float* c) {
  gemm_bf16_batched(path, ta, tb, 1, M, N, K, 1.0f, a, 0, b, 0, beta, c, 0);
}

// The routing of bf16 probs [R, E], on the probabilities widened to f32 (exact).
kernels::MoeRouting route(const uint16_t* probs, int64_t R, int64_t E, int64_t k, bool norm) {
  std::vector<float> p(size_t(R * E));
  cast<uint16_t, float>(probs, p.data(), R * E);
  return kernels::moe_route<float>(p.data(), R, E, k, norm);
}

// A chunk of expert e's rows: n slots from `slot` (slot / k is the token's row).
struct Chunk {
  const int64_t* slot;
  int64_t n, k;
  int64_t row(int64_t a) const { return slot[a] / k; }
};

// dst [n, C] = the chunk's rows of src [R, C].
void gather(const Chunk& ch, const uint16_t* src, uint16_t* dst, int64_t C) {
#pragma omp parallel for schedule(static) if (ch.n * C > kGrain)
  for (int64_t a = 0; a < ch.n; ++a) std::copy_n(src + ch.row(a) * C, C, dst + a * C);
}

// sums[row(a)] += w_a · src[a] (w null: 1); a chunk's rows are distinct tokens, so no races.
void scatter_add(const Chunk& ch, const float* src, const double* w, float* sums, int64_t C) {
#pragma omp parallel for schedule(static) if (ch.n * C > kGrain)
  for (int64_t a = 0; a < ch.n; ++a) {
    const float wa = w ? float(w[ch.slot[a]]) : 1.0f;
    float* o = sums + ch.row(a) * C;
    const float* s = src + a * C;
    for (int64_t c = 0; c < C; ++c) o[c] += wa * s[c];
  }
}

// Calls f(e, chunk, first) for each chunk of each expert's rows, experts in index order.
template <class F>
void for_chunks(const kernels::MoeRouting& r, F&& f) {
  for (int64_t e = 0; e < r.E; ++e)
    for (int64_t a0 = 0; a0 < r.rows_of(e); a0 += kernels::kMlpChunkRows)
      f(e, Chunk{r.slot.data() + r.offset[size_t(e)] + a0, std::min(kernels::kMlpChunkRows, r.rows_of(e) - a0), r.k},
        a0 == 0);
}

}  // namespace

void moe_experts_forward_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* probs, const uint16_t* const* w_gate,
                              const uint16_t* const* w_up, const uint16_t* const* w_down, uint16_t* y, int64_t R,
                              int64_t C, int64_t E, int64_t I, int64_t k, bool norm) {
  AUTOSP_ASSERT(R >= 0 && C > 0 && E > 0 && I > 0 && k > 0 && k <= E, "moe_experts_forward_bf16: R ", R, " C ", C,
                " E ", E, " I ", I, " k ", k);
  const kernels::MoeRouting r = route(probs, R, E, k, norm);
  const int64_t rows = std::min(r.max_rows(), kernels::kMlpChunkRows);
  std::vector<float> sums(size_t(R * C), 0.0f), g(size_t(rows * I)), u(g.size()), ye(size_t(rows * C));
  std::vector<uint16_t> xe(size_t(rows * C)), h(g.size());
  for_chunks(r, [&](int64_t e, const Chunk& ch, bool) {
    gather(ch, x, xe.data(), C);
    gemm16(path, false, true, ch.n, I, C, xe.data(), w_gate[e], 0.0f, g.data());  // g = xe · Wgᵀ
    gemm16(path, false, true, ch.n, I, C, xe.data(), w_up[e], 0.0f, u.data());    // u = xe · Wuᵀ
    swiglu<float>(g.data(), u.data(), g.data(), ch.n * I);
    cast<float, uint16_t>(g.data(), h.data(), ch.n * I);
    gemm16(path, false, true, ch.n, C, I, h.data(), w_down[e], 0.0f, ye.data());  // ye = h · Wdᵀ
    scatter_add(ch, ye.data(), r.weight.data(), sums.data(), C);
  });
  cast<float, uint16_t>(sums.data(), y, R * C);
}

void moe_experts_backward_bf16(Bf16Gemm path, const uint16_t* dy, const uint16_t* x, const uint16_t* probs,
                               const uint16_t* const* w_gate, const uint16_t* const* w_up,
                               const uint16_t* const* w_down, uint16_t* dx, uint16_t* dprobs,
                               uint16_t* const* dw_gate, uint16_t* const* dw_up, uint16_t* const* dw_down, int64_t R,
                               int64_t C, int64_t E, int64_t I, int64_t k, bool norm) {
  AUTOSP_ASSERT(R >= 0 && C > 0 && E > 0 && I > 0 && k > 0 && k <= E, "moe_experts_backward_bf16: R ", R, " C ", C,
                " E ", E, " I ", I, " k ", k);
  const kernels::MoeRouting r = route(probs, R, E, k, norm);
  const int64_t rows = std::min(r.max_rows(), kernels::kMlpChunkRows);
  std::vector<float> dx_sums(size_t(R * C), 0.0f), g(size_t(rows * I)), u(g.size()), d(g.size()), hv(g.size());
  std::vector<float> dxe(size_t(rows * C)), dwg(size_t(I * C)), dwu(dwg.size()), dwd(dwg.size());
  std::vector<uint16_t> xe(size_t(rows * C)), dye(xe.size()), hw(g.size()), dg(g.size()), du(g.size());
  std::vector<double> grad(size_t(R * k), 0.0);  // each slot's weight gradient: dy · the expert's output
  const auto round_into = [](const std::vector<float>& from, uint16_t* to, int64_t n) {
    cast<float, uint16_t>(from.data(), to, n);
  };
  int64_t last = -1;  // the expert whose gradients the f32 sums hold
  const auto finish = [&](int64_t e) {
    round_into(dwg, dw_gate[e], I * C), round_into(dwu, dw_up[e], I * C), round_into(dwd, dw_down[e], C * I);
  };
  for (int64_t e = 0; e < E; ++e)  // an expert no row reached gets zero gradients
    if (r.rows_of(e) == 0)
      for (uint16_t* const* dw : {dw_gate, dw_up, dw_down}) std::fill(dw[e], dw[e] + I * C, uint16_t(0));
  for_chunks(r, [&](int64_t e, const Chunk& ch, bool first) {
    if (first && last >= 0) finish(last);
    last = e;
    const int64_t n = ch.n * I;
    const float beta = first ? 0.0f : 1.0f;  // an expert's first chunk overwrites its sums
    gather(ch, x, xe.data(), C);
    gather(ch, dy, dye.data(), C);
    gemm16(path, false, true, ch.n, I, C, xe.data(), w_gate[e], 0.0f, g.data());  // g = xe · Wgᵀ
    gemm16(path, false, true, ch.n, I, C, xe.data(), w_up[e], 0.0f, u.data());    // u = xe · Wuᵀ
    gemm16(path, false, false, ch.n, I, C, dye.data(), w_down[e], 0.0f, d.data());  // d = dy_e · Wd
    swiglu<float>(g.data(), u.data(), hv.data(), n);  // h = silu(g) · u, unweighted
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t a = 0; a < ch.n; ++a) {  // the slot's weight gradient Σ d·h, then h ← w·h, d ← w·d
      const float w = float(r.weight[size_t(ch.slot[a])]);
      float* ha = hv.data() + a * I;
      float* da = d.data() + a * I;
      double dot = 0;
      for (int64_t i = 0; i < I; ++i) dot += double(da[i]) * double(ha[i]);
      grad[size_t(ch.slot[a])] = dot;
      for (int64_t i = 0; i < I; ++i) ha[i] *= w, da[i] *= w;
    }
    cast<float, uint16_t>(hv.data(), hw.data(), n);
    swiglu_backward<float>(d.data(), g.data(), u.data(), g.data(), u.data(), n);  // dg, du (from w·d)
    cast<float, uint16_t>(g.data(), dg.data(), n);
    cast<float, uint16_t>(u.data(), du.data(), n);
    gemm16(path, true, false, C, I, ch.n, dye.data(), hw.data(), beta, dwd.data());  // dWd += dy_eᵀ · (w·h)
    gemm16(path, false, false, ch.n, C, I, dg.data(), w_gate[e], 0.0f, dxe.data());  // dx_e = dg · Wg + du · Wu
    gemm16(path, false, false, ch.n, C, I, du.data(), w_up[e], 1.0f, dxe.data());
    gemm16(path, true, false, I, C, ch.n, dg.data(), xe.data(), beta, dwg.data());  // dWg += dgᵀ · xe
    gemm16(path, true, false, I, C, ch.n, du.data(), xe.data(), beta, dwu.data());  // dWu += duᵀ · xe
    scatter_add(ch, dxe.data(), nullptr, dx_sums.data(), C);
  });
  if (last >= 0) finish(last);
  cast<float, uint16_t>(dx_sums.data(), dx, R * C);
  std::vector<float> dp(size_t(R * E));
  kernels::moe_probs_grad<float>(r, norm, grad.data(), dp.data());
  cast<float, uint16_t>(dp.data(), dprobs, R * E);
}

}  // namespace autosp::cpu
