// The CPU grouped expert MLP on bf16 (kernels/cpu/moe_bf16.h): per expert, chunks of its rows
// gathered as bf16, the GEMMs on the bf16 GEMM path, the SwiGLU and its gradient in f32
// (elementwise.h's vectorised kernels; gpt-oss's experts: moe.h's activation rows, the f32
// kernel's), the per-token sums and the weight gradients in f32, the bias gradients in double.
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

kernels::MoeRouting moe_route_bf16(const uint16_t* probs, int64_t R, int64_t E, int64_t k, bool norm) {
  std::vector<float> p(size_t(R * E));
  cast<uint16_t, float>(probs, p.data(), R * E);
  return kernels::moe_route<float>(p.data(), R, E, k, norm);
}

void moe_probs_grad_bf16(const kernels::MoeRouting& r, bool norm, const double* g, uint16_t* dprobs) {
  std::vector<float> dp(size_t(r.R * r.E));
  kernels::moe_probs_grad<float>(r, norm, g, dp.data());
  cast<float, uint16_t>(dp.data(), dprobs, r.R * r.E);
}

ExpertBf16::ExpertBf16(Bf16Gemm path, int64_t rows, int64_t C, int64_t I)
    : path_(path), C_(C), I_(I), g_(size_t(rows * I)), u_(g_.size()), h16_(g_.size()) {
  AUTOSP_ASSERT(rows >= 0 && rows <= kernels::kMlpChunkRows && C > 0 && I > 0, "ExpertBf16: rows ", rows, " C ", C,
                " I ", I);
}

void ExpertBf16::add_biases(const ExpertBits& ex, int64_t n) {
  const int64_t C = C_, I = I_;
  if (!ex.bg) return;
  if (ex.bg != widened_) {
    bg_.resize(size_t(I)), bu_.resize(size_t(I)), bd_.resize(size_t(C));
    cast<uint16_t, float>(ex.bg, bg_.data(), I);
    cast<uint16_t, float>(ex.bu, bu_.data(), I);
    cast<uint16_t, float>(ex.bd, bd_.data(), C);
    widened_ = ex.bg;
  }
#pragma omp parallel for schedule(static) if (n * I > kGrain)
  for (int64_t a = 0; a < n; ++a)
    for (int64_t i = 0; i < I; ++i) g_[size_t(a * I + i)] += bg_[size_t(i)], u_[size_t(a * I + i)] += bu_[size_t(i)];
}

void ExpertBf16::forward(const ExpertBits& ex, const uint16_t* xe, int64_t n, float* ye) {
  const int64_t C = C_, I = I_;
  AUTOSP_ASSERT(n >= 0 && n * I <= int64_t(g_.size()), "ExpertBf16::forward: ", n, " rows");
  gemm_bf16(path_, false, true, n, I, C, xe, ex.wg, 0.0f, g_.data());  // g = xe · Wgᵀ (+ bg)
  gemm_bf16(path_, false, true, n, I, C, xe, ex.wu, 0.0f, u_.data());  // u = xe · Wuᵀ (+ bu)
  if (options(ex)) {
    add_biases(ex, n);
    const float alpha = float(ex.alpha), limit = float(ex.limit);
#pragma omp parallel for schedule(static) if (n * I > kGrain)
    for (int64_t a = 0; a < n; ++a)
      expert_activation_row(ex.clamped, alpha, limit, g_.data() + a * I, u_.data() + a * I, g_.data() + a * I, I);
  } else {
    swiglu<float>(g_.data(), u_.data(), g_.data(), n * I);
  }
  cast<float, uint16_t>(g_.data(), h16_.data(), n * I);
  gemm_bf16(path_, false, true, n, C, I, h16_.data(), ex.wd, 0.0f, ye);  // ye = h · Wdᵀ (+ bd)
  if (ex.bg) {
#pragma omp parallel for schedule(static) if (n * C > kGrain)
    for (int64_t a = 0; a < n; ++a)
      for (int64_t c = 0; c < C; ++c) ye[a * C + c] += bd_[size_t(c)];
  }
}

void ExpertBf16::backward(const ExpertBits& ex, const uint16_t* xe, const uint16_t* dye, const float* w, int64_t n,
                          bool first, double* grad, float* dxe) {
  const int64_t C = C_, I = I_, m = n * I;
  AUTOSP_ASSERT(n >= 0 && m <= int64_t(g_.size()), "ExpertBf16::backward: ", n, " rows");
  if (d_.empty()) {  // the backward's scratch, on its first call
    d_.resize(g_.size()), h_.resize(g_.size()), dg16_.resize(g_.size()), du16_.resize(g_.size());
    dwg_.resize(size_t(I * C)), dwu_.resize(dwg_.size()), dwd_.resize(dwg_.size());
  }
  const float beta = first ? 0.0f : 1.0f;  // an expert's first chunk overwrites its sums
  gemm_bf16(path_, false, true, n, I, C, xe, ex.wg, 0.0f, g_.data());   // g = xe · Wgᵀ (+ bg)
  gemm_bf16(path_, false, true, n, I, C, xe, ex.wu, 0.0f, u_.data());   // u = xe · Wuᵀ (+ bu)
  gemm_bf16(path_, false, false, n, I, C, dye, ex.wd, 0.0f, d_.data());  // d = dy_e · Wd
  if (options(ex)) {  // gpt-oss's: the f32 kernel's activation rows (g ← dg, u ← du, h ← w·h; d·h)
    add_biases(ex, n);
    const float alpha = float(ex.alpha), limit = float(ex.limit);
    const bool biased = ex.bg != nullptr;
#pragma omp parallel for schedule(static) if (m > kGrain)
    for (int64_t a = 0; a < n; ++a) {
      double dot = expert_activation_grad_row(ex.clamped, alpha, limit, g_.data() + a * I, u_.data() + a * I,
                                              d_.data() + a * I, h_.data() + a * I, w[a], I);
      if (biased)  // ye = h · Wdᵀ + bd: the bias's share of dy · ye
        for (int64_t c = 0; c < C; ++c) dot += double(bf16_to_f32(dye[a * C + c])) * double(bd_[size_t(c)]);
      grad[a] = dot;
    }
    if (biased) {  // dbd += Σ w·dy_e, dbg += Σ dg, dbu += Σ du, in double
      if (first) dbg_.assign(size_t(I), 0.0), dbu_.assign(size_t(I), 0.0), dbd_.assign(size_t(C), 0.0);
      for (int64_t a = 0; a < n; ++a) {
        const float* dg = g_.data() + a * I;
        const float* du = u_.data() + a * I;
        for (int64_t i = 0; i < I; ++i) dbg_[size_t(i)] += double(dg[i]), dbu_[size_t(i)] += double(du[i]);
        for (int64_t c = 0; c < C; ++c) dbd_[size_t(c)] += double(w[a]) * double(bf16_to_f32(dye[a * C + c]));
      }
    }
    cast<float, uint16_t>(h_.data(), h16_.data(), m);
  } else {
    swiglu<float>(g_.data(), u_.data(), h_.data(), m);  // h = silu(g) · u, unweighted
#pragma omp parallel for schedule(static) if (m > kGrain)
    for (int64_t a = 0; a < n; ++a) {  // the row's weight gradient Σ d·h, then h ← w·h, d ← w·d
      float* ha = h_.data() + a * I;
      float* da = d_.data() + a * I;
      double dot = 0;
      for (int64_t i = 0; i < I; ++i) dot += double(da[i]) * double(ha[i]);
      grad[a] = dot;
      for (int64_t i = 0; i < I; ++i) ha[i] *= w[a], da[i] *= w[a];
    }
    cast<float, uint16_t>(h_.data(), h16_.data(), m);
    swiglu_backward<float>(d_.data(), g_.data(), u_.data(), g_.data(), u_.data(), m);  // dg, du (from w·d)
  }
  cast<float, uint16_t>(g_.data(), dg16_.data(), m);
  cast<float, uint16_t>(u_.data(), du16_.data(), m);
  gemm_bf16(path_, true, false, C, I, n, dye, h16_.data(), beta, dwd_.data());  // dWd += dy_eᵀ · (w·h)
  gemm_bf16(path_, false, false, n, C, I, dg16_.data(), ex.wg, 0.0f, dxe);      // dx_e = dg · Wg + du · Wu
  gemm_bf16(path_, false, false, n, C, I, du16_.data(), ex.wu, 1.0f, dxe);
  gemm_bf16(path_, true, false, I, C, n, dg16_.data(), xe, beta, dwg_.data());  // dWg += dgᵀ · xe
  gemm_bf16(path_, true, false, I, C, n, du16_.data(), xe, beta, dwu_.data());  // dWu += duᵀ · xe
}

void ExpertBf16::finish(const ExpertBits& ex) const {
  const int64_t n = I_ * C_;
  cast<float, uint16_t>(dwg_.data(), ex.dwg, n);
  cast<float, uint16_t>(dwu_.data(), ex.dwu, n);
  cast<float, uint16_t>(dwd_.data(), ex.dwd, n);
  if (!ex.dbg) return;
  AUTOSP_ASSERT(dbg_.size() == size_t(I_), "ExpertBf16::finish: bias gradients without a biased backward");
  std::transform(dbg_.begin(), dbg_.end(), ex.dbg, f64_to_bf16);
  std::transform(dbu_.begin(), dbu_.end(), ex.dbu, f64_to_bf16);
  std::transform(dbd_.begin(), dbd_.end(), ex.dbd, f64_to_bf16);
}

void zero_expert_grads_bf16(const ExpertBits& ex, int64_t C, int64_t I) {
  for (uint16_t* dw : {ex.dwg, ex.dwu, ex.dwd}) std::fill(dw, dw + I * C, uint16_t(0));
  if (!ex.dbg) return;
  std::fill(ex.dbg, ex.dbg + I, uint16_t(0));
  std::fill(ex.dbu, ex.dbu + I, uint16_t(0));
  std::fill(ex.dbd, ex.dbd + C, uint16_t(0));
}

void moe_experts_forward_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* probs, const uint16_t* const* w_gate,
                              const uint16_t* const* w_up, const uint16_t* const* w_down, uint16_t* y, int64_t R,
                              int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                              const kernels::MoeOptions<uint16_t>& opt) {
  AUTOSP_ASSERT(R >= 0 && C > 0 && E > 0 && I > 0 && k > 0 && k <= E, "moe_experts_forward_bf16: R ", R, " C ", C,
                " E ", E, " I ", I, " k ", k);
  const kernels::MoeRouting r = moe_route_bf16(probs, R, E, k, norm);
  const int64_t rows = std::min(r.max_rows(), kernels::kMlpChunkRows);
  ExpertBf16 ex(path, rows, C, I);
  std::vector<float> sums(size_t(R * C), 0.0f), ye(size_t(rows * C));
  std::vector<uint16_t> xe(size_t(rows * C));
  for_chunks(r, [&](int64_t e, const Chunk& ch, bool) {
    gather(ch, x, xe.data(), C);
    ex.forward(ExpertBits::of(w_gate, w_up, w_down, opt, e), xe.data(), ch.n, ye.data());
    scatter_add(ch, ye.data(), r.weight.data(), sums.data(), C);
  });
  cast<float, uint16_t>(sums.data(), y, R * C);
}

void moe_experts_backward_bf16(Bf16Gemm path, const uint16_t* dy, const uint16_t* x, const uint16_t* probs,
                               const uint16_t* const* w_gate, const uint16_t* const* w_up,
                               const uint16_t* const* w_down, uint16_t* dx, uint16_t* dprobs,
                               uint16_t* const* dw_gate, uint16_t* const* dw_up, uint16_t* const* dw_down, int64_t R,
                               int64_t C, int64_t E, int64_t I, int64_t k, bool norm,
                               const kernels::MoeOptions<uint16_t>& opt) {
  AUTOSP_ASSERT(R >= 0 && C > 0 && E > 0 && I > 0 && k > 0 && k <= E, "moe_experts_backward_bf16: R ", R, " C ", C,
                " E ", E, " I ", I, " k ", k);
  const kernels::MoeRouting r = moe_route_bf16(probs, R, E, k, norm);
  const int64_t rows = std::min(r.max_rows(), kernels::kMlpChunkRows);
  ExpertBf16 ex(path, rows, C, I);
  std::vector<float> dx_sums(size_t(R * C), 0.0f), dxe(size_t(rows * C)), w(static_cast<size_t>(rows));
  std::vector<uint16_t> xe(size_t(rows * C)), dye(xe.size());
  // each slot's weight gradient (dy · the expert's output), and a chunk's
  std::vector<double> grad(size_t(R * k), 0.0), gc(static_cast<size_t>(rows));
  const auto expert = [&](int64_t e) {  // expert e with the gradients it writes
    ExpertBits ex = ExpertBits::of(w_gate, w_up, w_down, opt, e);
    ex.dwg = dw_gate[e], ex.dwu = dw_up[e], ex.dwd = dw_down[e];
    return ex;
  };
  int64_t last = -1;  // the expert whose gradients the f32 sums hold
  for (int64_t e = 0; e < E; ++e)  // an expert no row reached gets zero gradients
    if (r.rows_of(e) == 0) zero_expert_grads_bf16(expert(e), C, I);
  for_chunks(r, [&](int64_t e, const Chunk& ch, bool first) {
    if (first && last >= 0) ex.finish(expert(last));
    last = e;
    gather(ch, x, xe.data(), C);
    gather(ch, dy, dye.data(), C);
    for (int64_t a = 0; a < ch.n; ++a) w[size_t(a)] = float(r.weight[size_t(ch.slot[a])]);
    ex.backward(expert(e), xe.data(), dye.data(), w.data(), ch.n, first, gc.data(), dxe.data());
    for (int64_t a = 0; a < ch.n; ++a) grad[size_t(ch.slot[a])] = gc[size_t(a)];
    scatter_add(ch, dxe.data(), nullptr, dx_sums.data(), C);
  });
  if (last >= 0) ex.finish(expert(last));
  cast<float, uint16_t>(dx_sums.data(), dx, R * C);
  moe_probs_grad_bf16(r, norm, grad.data(), dprobs);
}

}  // namespace autosp::cpu
