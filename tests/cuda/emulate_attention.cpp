// The CUDA flash-attention launchers and kernels (tensor-core bf16 and SIMT), run on the CPU by the
// emulation in emulation.h, against the CPU flash attention: forward (o, lse) and backward (dq, dk,
// dv); with sinks, against gpt-oss's eager attention written here in float64 (dsinks too). This
// runs everywhere (no GPU needed), so CI checks the kernels' tiling, masking, online
// softmax and fragment bookkeeping; autosp-cuda-tests checks the same kernels on a real GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cuda/emulation.h"

namespace autosp::cuda {
__attribute__((section("autosp_emu_dynamic_shared"))) alignas(16) unsigned char attention_smem[227 * 1024];  // the kernels' dynamic shared memory
}  // namespace autosp::cuda

#include "common/naive.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/attention.cu"
#include "kernels/kernel_test.h"

namespace {

using namespace autosp;
using autosp::cuda::bf16;

struct Case {
  int64_t B, N, Nkv, Sq, Skv, D;
  bool causal;
  int64_t doc_len = 0;  // packed documents (Sq == Skv, causal): lengths cycling doc_len, doc_len / 3 + 1, …; 0: none
  int64_t window = 0, offset = 0;  // a sliding window (kernels/attention_variant.h), with a ring pair's offset
  double softcap = 0;
};

// Document starts [B, Sq] of documents whose lengths cycle through doc_len, doc_len / 3 + 1 and
// 2·doc_len + 5 (starting at a different point on each row), so tiles hold 0, 1 or several starts.
std::vector<int64_t> document_starts(const Case& c) {
  std::vector<int64_t> starts(size_t(c.B * c.Sq));
  const int64_t lens[3] = {c.doc_len, c.doc_len / 3 + 1, 2 * c.doc_len + 5};
  for (int64_t b = 0; b < c.B; ++b) {
    int64_t begin = 0, next = lens[b % 3], which = b % 3;
    for (int64_t t = 0; t < c.Sq; ++t) {
      if (t == next) begin = t, which = (which + 1) % 3, next = t + lens[which];
      starts[size_t(b * c.Sq + t)] = begin;
    }
  }
  return starts;
}

bf16 to_bf16(float x) {
  const uint16_t h = cpu::f32_to_bf16(x);
  bf16 v;
  std::memcpy(static_cast<void*>(&v), &h, 2);
  return v;
}
float from_bf16(bf16 v) {
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return cpu::bf16_to_f32(h);
}

// Storage T (float or bf16) of values x, and the floats the kernel actually sees.
template <class T>
std::vector<T> store(const naive::Vec& x, std::vector<float>& seen) {
  std::vector<T> out(x.size());
  seen.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) {
      out[i] = to_bf16(float(x[i]));
      seen[i] = from_bf16(out[i]);
    } else {
      out[i] = float(x[i]);
      seen[i] = out[i];
    }
  }
  return out;
}

template <class T>
naive::Vec widen(const std::vector<T>& x) {
  naive::Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>)
      out[i] = from_bf16(x[i]);
    else
      out[i] = double(x[i]);
  }
  return out;
}

// A case's operands: q, k, v, dout in storage T (normal, from `seed` on), the floats the kernels
// see (qf, …), the document starts (null without documents) and the kernels to run (kMma: the
// launchers' automatic choice, which is the tensor cores for bf16 at D 64/128; else SIMT).
template <class T, bool kMma>
struct Operands {
  int64_t nq, nkv, nl;  // elements of q (and dout), of k (and v), rows of lse
  std::vector<float> qf, kf, vf, dof;
  std::vector<T> q, k, v, dout;
  std::vector<int64_t> starts_v;
  const int64_t* starts;
  cuda::SdpaKernel kernel = kMma ? cuda::SdpaKernel::automatic : cuda::SdpaKernel::simt;
  double scale;
  Operands(const Case& c, uint32_t seed)
      : nq(c.B * c.N * c.Sq * c.D),
        nkv(c.B * c.Nkv * c.Skv * c.D),
        nl(c.B * c.N * c.Sq),
        q(store<T>(naive::random_normal(nq, seed), qf)),
        k(store<T>(naive::random_normal(nkv, seed + 1), kf)),
        v(store<T>(naive::random_normal(nkv, seed + 2), vf)),
        dout(store<T>(naive::random_normal(nq, seed + 3), dof)),
        starts_v(c.doc_len > 0 ? document_starts(c) : std::vector<int64_t>()),
        starts(c.doc_len > 0 ? starts_v.data() : nullptr),
        scale(1.0 / std::sqrt(double(c.D))) {}
};

// Runs sdpa_forward / sdpa_backward (the launchers, so also their choice of kernel and launch
// geometry) under emulation and compares with the CPU kernels. kMma: the tensor-core path
// (automatic, bf16, D 64/128) or the SIMT path.
template <class T, bool kMma>
void check_emulated(const Case& c, uint32_t seed) {
  INFO("B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " Sq " << c.Sq << " Skv " << c.Skv << " D " << c.D
            << " causal " << c.causal << " documents " << c.doc_len << " window " << c.window << " offset " << c.offset
            << " softcap " << c.softcap
            << (kMma ? " mma" : " simt"));
  const AttentionVariant<float> var{.window = c.window, .softcap = c.softcap, .offset = c.offset};
  const Operands<T, kMma> in(c, seed);
  const auto &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  const auto &qf = in.qf, &kf = in.kf, &vf = in.vf, &dof = in.dof;
  const int64_t nq = in.nq, nkv = in.nkv, nl = in.nl;
  const int64_t* starts = in.starts;
  const cuda::SdpaKernel kernel = in.kernel;
  const double scale = in.scale, tol = std::is_same_v<T, bf16> ? 1e-2 : 1e-5;

  // CPU reference (float, on the values the kernel sees)
  std::vector<float> o_ref(static_cast<size_t>(nq)), lse_ref(static_cast<size_t>(nl));
  cpu::sdpa_forward<float>(qf.data(), kf.data(), vf.data(), o_ref.data(), lse_ref.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv,
                           c.D, scale, c.causal, starts, var);
  std::vector<T> o(static_cast<size_t>(nq));
  std::vector<float> lse(static_cast<size_t>(nl));
  cuda::sdpa_forward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale,
                        c.causal, nullptr, kernel, starts, var);
  test::check_close(widen(o), widen(o_ref), tol);
  test::check_close(widen(lse), widen(lse_ref), tol);

  // CPU backward, reading o as the kernel stored it
  const naive::Vec o_wide = widen(o);
  const std::vector<float> o_seen(o_wide.begin(), o_wide.end());
  std::vector<float> gq_ref(static_cast<size_t>(nq)), gk_ref(static_cast<size_t>(nkv)),
      gv_ref(static_cast<size_t>(nkv));
  cpu::sdpa_backward<float>(qf.data(), kf.data(), vf.data(), o_seen.data(), lse_ref.data(), dof.data(), gq_ref.data(),
                            gk_ref.data(), gv_ref.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, starts,
                            nullptr, var);
  std::vector<T> gq(static_cast<size_t>(nq)), gk(static_cast<size_t>(nkv)), gv(static_cast<size_t>(nkv));
  cuda::sdpa_backward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), gq.data(), gk.data(),
                         gv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, nullptr, kernel, starts, var);
  {
    INFO("dq");
    test::check_close(widen(gq), widen(gq_ref), tol);
  }
  {
    INFO("dk");
    test::check_close(widen(gk), widen(gk_ref), tol);
  }
  {
    INFO("dv");
    test::check_close(widen(gv), widen(gv_ref), tol);
  }
}

// gpt-oss's eager attention with sinks (transformers' modeling_gpt_oss.py eager_attention_forward),
// in float64: per (b, h), the logits [Sq, Skv] (scale · q·k, softcapped, -inf where the causal
// mask, the window or a document hides the key), the head's sink appended as column Skv, softmax
// over the Skv + 1 columns, the column dropped, o = P · v; lse = log Σ_j exp(logit) over all
// Skv + 1 columns. The backward goes through the same materialised softmax by its explicit
// Jacobian (naive::softmax_backward): dP = dout · vᵀ with 0 in the sink's column (it attends to
// nothing), dlogits = softmax_backward(dP, P), dsink_h = Σ_{b,i} dlogits[i, Skv], and
// dq = Σ_j dlogit_ij · ∂logit/∂(q·k) · k_j, dk, dv = Pᵀ · dout likewise (GQA heads summed).
struct Eager {
  naive::Vec o, lse, dq, dk, dv, dsinks;
};
Eager eager_attention(const Case& c, const naive::Vec& q, const naive::Vec& k, const naive::Vec& v,
                      const naive::Vec& sinks, const naive::Vec& dout, const int64_t* starts, double scale) {
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t C = c.Skv + 1, group = c.N / c.Nkv, shift = c.Skv - c.Sq + c.offset;
  Eager r{naive::Vec(size_t(c.B * c.N * c.Sq * c.D)), naive::Vec(size_t(c.B * c.N * c.Sq)),
          naive::Vec(size_t(c.B * c.N * c.Sq * c.D)), naive::Vec(size_t(c.B * c.Nkv * c.Skv * c.D)),
          naive::Vec(size_t(c.B * c.Nkv * c.Skv * c.D)), naive::Vec(size_t(c.N))};
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.N; ++h) {
      const size_t qh = size_t((b * c.N + h) * c.Sq * c.D), kh = size_t((b * c.Nkv + h / group) * c.Skv * c.D);
      naive::Vec logits(size_t(c.Sq * C)), dlogit_draw(size_t(c.Sq * C)), dP(size_t(c.Sq * C), 0.0);
      for (int64_t i = 0; i < c.Sq; ++i) {
        for (int64_t j = 0; j < c.Skv; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d) dot += q[qh + size_t(i * c.D + d)] * k[kh + size_t(j * c.D + d)];
          double logit = scale * dot, deriv = scale;
          if (c.softcap > 0) {
            const double t = std::tanh(logit / c.softcap);
            logit = c.softcap * t, deriv = scale * (1 - t * t);
          }
          const bool visible = (!c.causal || j <= i + shift) && (c.window == 0 || j > i + shift - c.window) &&
                               (starts == nullptr || j >= starts[b * c.Sq + i]);
          logits[size_t(i * C + j)] = visible ? logit : -inf;
          dlogit_draw[size_t(i * C + j)] = deriv;
          for (int64_t d = 0; d < c.D; ++d)
            dP[size_t(i * C + j)] += dout[qh + size_t(i * c.D + d)] * v[kh + size_t(j * c.D + d)];
        }
        logits[size_t(i * C + c.Skv)] = sinks[size_t(h)];
      }
      const naive::Vec P = naive::softmax(logits, c.Sq, C);
      const naive::Vec dlogits = naive::softmax_backward(dP, P, c.Sq, C);
      for (int64_t i = 0; i < c.Sq; ++i) {
        double mx = -inf, sum = 0;
        for (int64_t j = 0; j < C; ++j) mx = std::max(mx, logits[size_t(i * C + j)]);
        for (int64_t j = 0; j < C; ++j) sum += std::exp(logits[size_t(i * C + j)] - mx);
        r.lse[size_t((b * c.N + h) * c.Sq + i)] = mx + std::log(sum);
        r.dsinks[size_t(h)] += dlogits[size_t(i * C + c.Skv)];
        for (int64_t j = 0; j < c.Skv; ++j) {
          const double p = P[size_t(i * C + j)], draw = dlogits[size_t(i * C + j)] * dlogit_draw[size_t(i * C + j)];
          for (int64_t d = 0; d < c.D; ++d) {
            const size_t qi = qh + size_t(i * c.D + d), kj = kh + size_t(j * c.D + d);
            r.o[qi] += p * v[kj];
            r.dq[qi] += draw * k[kj];
            r.dk[kj] += draw * q[qi];
            r.dv[kj] += p * dout[qi];
          }
        }
      }
    }
  return r;
}

// Runs the launchers with sinks under emulation, forward (o, lse) and backward (dq, dk, dv,
// dsinks), against eager_attention on the values the kernels read. The sinks cycle through values
// that carry from almost none to most of a row's weight (8 beats every logit here), so a sink left
// out of the denominator, the lse or dsinks shows. `repeat`: run the backward twice and require
// the same bits (the emulation schedules threads in a fresh random order each time).
template <class T, bool kMma>
void check_with_sinks(const Case& c, uint32_t seed, bool repeat = false) {
  INFO("sinks: B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " Sq " << c.Sq << " Skv " << c.Skv << " D " << c.D
                   << " causal " << c.causal << " documents " << c.doc_len << " window " << c.window << " offset "
                   << c.offset << " softcap " << c.softcap << (kMma ? " mma" : " simt"));
  const Operands<T, kMma> in(c, seed);
  const auto &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  const int64_t nq = in.nq, nkv = in.nkv, nl = in.nl;
  const int64_t* starts = in.starts;
  const cuda::SdpaKernel kernel = in.kernel;
  const double scale = in.scale;
  // f32: within 4e-7 seen. bf16: the kernels round P (tensor cores) and o to bf16 and read the
  // rounded o in Δ, while the reference is exact: within 9e-3 seen (scaled by 1 + |ref|).
  const double tol = std::is_same_v<T, bf16> ? 2e-2 : 1e-5;
  const double kSinks[] = {1.5, -3.0, 8.0, 0.25, 3.5};
  naive::Vec sink_values(size_t(c.N));
  for (int64_t h = 0; h < c.N; ++h) sink_values[size_t(h)] = kSinks[size_t(h) % 5];
  std::vector<float> sinks;
  store<T>(sink_values, sinks);  // the kernels read f32 sinks; a bf16 model's are bf16 values
  const Eager ref =
      eager_attention(c, widen(in.qf), widen(in.kf), widen(in.vf), widen(sinks), widen(in.dof), starts, scale);

  std::vector<float> dsinks(size_t(c.N), -777.f);
  const AttentionVariant<float> var{
      .window = c.window, .softcap = c.softcap, .offset = c.offset, .sinks = sinks.data(), .dsinks = dsinks.data()};
  std::vector<T> o(static_cast<size_t>(nq));
  std::vector<float> lse(static_cast<size_t>(nl));
  cuda::sdpa_forward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale,
                        c.causal, nullptr, kernel, starts, var);
  std::vector<T> gq(static_cast<size_t>(nq)), gk(static_cast<size_t>(nkv)), gv(static_cast<size_t>(nkv));
  cuda::sdpa_backward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), gq.data(), gk.data(),
                         gv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, nullptr, kernel, starts, var);
  const std::pair<const char*, std::pair<naive::Vec, const naive::Vec*>> checks[] = {
      {"o", {widen(o), &ref.o}},     {"lse", {widen(lse), &ref.lse}}, {"dq", {widen(gq), &ref.dq}},
      {"dk", {widen(gk), &ref.dk}}, {"dv", {widen(gv), &ref.dv}},   {"dsinks", {widen(dsinks), &ref.dsinks}}};
  for (const auto& [name, got_ref] : checks) {
    INFO(name);
    test::check_close(got_ref.first, *got_ref.second, tol);
  }
  if (repeat) {
    std::vector<T> gq2(gq.size()), gk2(gk.size()), gv2(gv.size());
    std::vector<float> dsinks2(dsinks.size(), -777.f);
    AttentionVariant<float> var2 = var;
    var2.dsinks = dsinks2.data();
    cuda::sdpa_backward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), gq2.data(), gk2.data(),
                           gv2.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, c.causal, nullptr, kernel, starts,
                           var2);
    CHECK(std::memcmp(dsinks.data(), dsinks2.data(), dsinks.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(gq.data(), gq2.data(), gq.size() * sizeof(T)) == 0);
    CHECK(std::memcmp(gk.data(), gk2.data(), gk.size() * sizeof(T)) == 0);
    CHECK(std::memcmp(gv.data(), gv2.data(), gv.size() * sizeof(T)) == 0);
  }
}

}  // namespace

TEST_CASE("emulated tensor-core attention (bf16, D = 64) matches the CPU", "[cuda-emulation][attention]") {
  uint32_t seed = 1200;
  for (const Case& c : {Case{1, 4, 2, 130, 130, 64, true}, Case{1, 2, 2, 70, 200, 64, true},
                        Case{1, 2, 1, 150, 65, 64, true}, Case{2, 2, 2, 65, 100, 64, false}})
    check_emulated<bf16, true>(c, seed += 4);
}

TEST_CASE("emulated tensor-core attention (bf16, D = 128) matches the CPU", "[cuda-emulation][attention]") {
  uint32_t seed = 1300;
  for (const Case& c : {Case{1, 2, 1, 100, 100, 128, true}, Case{1, 2, 2, 33, 80, 128, false}})
    check_emulated<bf16, true>(c, seed += 4);
}

TEST_CASE("emulated SIMT attention matches the CPU", "[cuda-emulation][attention]") {
  uint32_t seed = 1400;
  check_emulated<float, false>(Case{1, 3, 3, 17, 40, 3, true}, seed += 4);
  check_emulated<float, false>(Case{1, 2, 2, 20, 45, 100, false}, seed += 4);
  check_emulated<float, false>(Case{1, 2, 1, 40, 20, 64, true}, seed += 4);
  check_emulated<bf16, false>(Case{1, 2, 1, 40, 40, 64, true}, seed += 4);
}

TEST_CASE("emulated attention with a document mask matches the CPU", "[cuda-emulation][attention][documents]") {
  uint32_t seed = 1500;
  // Tensor cores: documents shorter than, across and longer than the 64-row tiles.
  check_emulated<bf16, true>(Case{2, 4, 2, 200, 200, 64, true, 20}, seed += 4);
  check_emulated<bf16, true>(Case{1, 2, 1, 260, 260, 64, true, 70}, seed += 4);
  check_emulated<bf16, true>(Case{1, 2, 2, 150, 150, 128, true, 45}, seed += 4);
  // SIMT: tiles of 32 keys and 8 query rows.
  check_emulated<float, false>(Case{2, 2, 1, 90, 90, 16, true, 7}, seed += 4);
  check_emulated<float, false>(Case{1, 2, 2, 100, 100, 64, true, 40}, seed += 4);
  check_emulated<bf16, false>(Case{1, 2, 1, 70, 70, 64, true, 1}, seed += 4);
}

TEST_CASE("emulated attention with a sliding window matches the CPU", "[cuda-emulation][attention][variants]") {
  uint32_t seed = 1600;
  // The window becomes per-row key starts (kernels/cuda/attention.cuh): windows shorter than,
  // across and longer than the tiles, with documents too, and a ring pair's offset (not causal).
  check_emulated<bf16, true>(Case{1, 4, 2, 200, 200, 64, true, 0, 50}, seed += 4);
  check_emulated<bf16, true>(Case{1, 2, 1, 260, 260, 64, true, 70, 100}, seed += 4);
  check_emulated<bf16, true>(Case{1, 2, 2, 64, 64, 128, false, 0, 40, 64}, seed += 4);
  check_emulated<float, false>(Case{2, 2, 1, 90, 90, 16, true, 0, 7}, seed += 4);
  check_emulated<float, false>(Case{1, 2, 2, 100, 100, 64, true, 40, 33}, seed += 4);
  check_emulated<float, false>(Case{1, 2, 1, 40, 40, 8, false, 0, 20, 30}, seed += 4);
  // A windowed ring's tail (decision 135): a query chunk against only the last w - 1 keys of an
  // earlier chunk (Skv < Sq), placed by the chunks' offset.
  check_emulated<bf16, true>(Case{1, 2, 2, 64, 20, 64, false, 0, 21, 64}, seed += 4);
  check_emulated<float, false>(Case{1, 2, 1, 40, 7, 8, false, 0, 8, 40}, seed += 4);
}

TEST_CASE("emulated attention with a logit softcap matches the CPU", "[cuda-emulation][attention][variants]") {
  uint32_t seed = 1700;
  // The SIMT path (bf16 at D = 64 too: a softcap keeps it off the tensor cores), with a window and
  // documents; a small cap, so that it bends the logits.
  check_emulated<float, false>(Case{1, 2, 1, 70, 70, 16, true, 0, 0, 0, 0.5}, seed += 4);
  check_emulated<float, false>(Case{2, 2, 2, 90, 90, 32, true, 25, 30, 0, 1.0}, seed += 4);
  check_emulated<bf16, true>(Case{1, 2, 1, 80, 80, 64, true, 0, 40, 0, 0.7}, seed += 4);
}

TEST_CASE("emulated attention with sinks matches gpt-oss's eager attention", "[cuda-emulation][attention][sinks]") {
  uint32_t seed = 1800;
  // Tensor cores (bf16, D 64 and 128): GQA, several query and key tiles of 64, a window that cuts,
  // packed documents, and causal rows that see no key (Sq > Skv: o = 0, lse = the sink).
  check_with_sinks<bf16, true>(Case{2, 4, 2, 150, 150, 64, true, 0, 50}, seed += 4);
  check_with_sinks<bf16, true>(Case{1, 2, 1, 130, 130, 64, true, 40}, seed += 4);
  check_with_sinks<bf16, true>(Case{1, 2, 1, 100, 70, 128, true}, seed += 4);
  // SIMT (f32; bf16 too): tiles of 32 keys and 8 query rows, window and documents together, a
  // softcap, and a windowed ring pair's tail (not causal, offset).
  check_with_sinks<float, false>(Case{2, 4, 2, 90, 90, 16, true, 20, 30}, seed += 4, true);
  check_with_sinks<float, false>(Case{1, 2, 1, 70, 70, 32, true, 0, 25, 0, 1.5}, seed += 4);
  check_with_sinks<float, false>(Case{1, 2, 2, 40, 12, 8, false, 0, 16, 40}, seed += 4);
  check_with_sinks<bf16, false>(Case{1, 5, 1, 70, 70, 64, true, 0, 25}, seed += 4, true);
  // No queries: dsinks is still written (0), dk and dv too.
  check_with_sinks<float, false>(Case{1, 2, 1, 0, 5, 16, false}, seed += 4);
}

// Ring attention's merge by log-sum-exp (one thread per row) against the CPU's, on the same values:
// rows whose block saw nothing (lse_blk = -inf) stay, rows that had seen nothing take the block.
std::vector<float> naive_f32(int64_t n, uint64_t seed) {
  const std::vector<double> x = naive::random_normal(n, seed);
  return {x.begin(), x.end()};
}

TEST_CASE("emulated ring-attention merge matches the CPU", "[cuda-emulation][attention][ring]") {
  const int64_t rows = 37, D = 12;
  std::vector<float> o = naive_f32(rows * D, 1), lse = naive_f32(rows, 2), blk = naive_f32(rows * D, 3),
                     lse_blk = naive_f32(rows, 4);
  for (int64_t r = 0; r < rows; r += 5) lse_blk[size_t(r)] = -INFINITY;
  for (int64_t r = 1; r < rows; r += 7) lse[size_t(r)] = -INFINITY;
  std::vector<bf16> blk16(blk.size());
  for (size_t i = 0; i < blk.size(); ++i) blk16[i] = to_bf16(blk[i]), blk[i] = from_bf16(blk16[i]);
  std::vector<float> want_o = o, want_lse = lse;
  cpu::merge_attention<float>(want_o.data(), want_lse.data(), blk.data(), lse_blk.data(), rows, D);
  for (const bool half : {false, true}) {
    INFO((half ? "bf16 block" : "f32 block"));
    std::vector<float> got_o = o, got_lse = lse;
    if (half)
      cuda::merge_attention<bf16>(got_o.data(), got_lse.data(), blk16.data(), lse_blk.data(), rows, D, nullptr);
    else
      cuda::merge_attention<float>(got_o.data(), got_lse.data(), blk.data(), lse_blk.data(), rows, D, nullptr);
    for (int64_t r = 0; r < rows; ++r) {
      INFO("row " << r);
      CHECK(got_lse[size_t(r)] == Approx(want_lse[size_t(r)]).epsilon(1e-6).margin(1e-6));
      for (int64_t d = 0; d < D; ++d) CHECK(got_o[size_t(r * D + d)] == Approx(want_o[size_t(r * D + d)]).epsilon(1e-5).margin(1e-6));
    }
  }
}
