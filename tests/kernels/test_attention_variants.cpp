// The CPU flash attention's variants (kernels/attention_variant.h: sliding window, logit softcap,
// sinks, a ring pair's offset) against a float64 naive attention written here from the definitions
// (every score materialised, masked element by element, softcapped and softmaxed with the sink in
// the denominator), forward (o, lse) and backward (dq, dk, dv, dsinks), f32 and f64, GQA, windows
// that cut (S several times w, across the kernels' 128 × 512 and 64 × 256 tiles), windows with
// packed documents. The naive backward is itself checked against central differences of the
// naive forward, and the f64 kernel's against central differences of the kernel's forward. A
// window that cuts must differ from full attention (so the tests would catch a window ignored).
// The bf16 kernels (AVX512-BF16 tile products) against the same naive attention on the bf16
// values, within the CUDA attention tests' bf16 tolerance (1e-2), on every variant and on plain
// causal and non-causal GQA attention across tiles (SKIPPED where the CPU lacks AVX512-BF16).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "common/naive.h"
#include "kernel_test.h"
#include "kernels/bf16_test.h"
#include "kernels/cpu/attention.h"

namespace {

using namespace autosp;
using naive::Vec;

struct VarCase {
  int64_t B, N, Nkv, Sq, Skv, D;
  int64_t window;   // 0: none
  double softcap;   // 0: none
  bool sinks;
  int64_t offset;   // added to the causal shift Skv - Sq
  int64_t doc_len;  // > 0: documents of this length (doc_start), 0: none
};

const VarCase kCases[] = {
    {1, 1, 1, 9, 9, 4, 3, 0, false, 0, 0},             // a tiny window
    {2, 4, 2, 70, 70, 16, 16, 0, false, 0, 0},         // GQA, S ≈ 4 w
    {1, 2, 1, 1100, 1100, 16, 200, 0, false, 0, 0},    // S = 5.5 w, across key tiles of 512 and 256
    {1, 2, 2, 700, 700, 32, 600, 0, false, 0, 0},      // a window longer than a tile, shorter than S
    {1, 2, 2, 300, 300, 16, 0, 5.0, false, 0, 0},      // softcap alone (small cap: it bends the logits)
    {1, 2, 1, 300, 300, 16, 0, 0, true, 0, 0},         // sinks alone
    {2, 4, 2, 600, 600, 16, 128, 2.0, true, 0, 0},     // all three
    {1, 2, 1, 650, 650, 16, 100, 0, false, 0, 170},    // window and documents together
    {1, 2, 1, 64, 64, 8, 50, 3.0, true, 64, 0},        // a ring pair: keys 64 before the queries
    {1, 1, 1, 40, 40, 8, 20, 0, true, 30, 0},          // offset: the window reaches into the chunk
};

// Query i (at i + shift) sees key j: causal, in the window, in its document.
bool visible(const VarCase& c, const std::vector<int64_t>* starts, int64_t b, int64_t i, int64_t j) {
  const int64_t at = i + c.Skv - c.Sq + c.offset;
  if (j > at) return false;
  if (c.window > 0 && j <= at - c.window) return false;
  return starts == nullptr || j >= (*starts)[size_t(b * c.Sq + i)];
}

// The naive attention: per row, the capped logits of the visible keys and the sink, softmaxed.
// Fills o, lse; with grads, also dq, dk, dv, dsinks from dout by the chain rule on the materialised
// probabilities (d logit / d raw = scale · (1 - t²) under the cap).
struct Naive {
  Vec o, lse, dq, dk, dv, dsinks;
};
// o_seen (may be null): the o the backward reads (a bf16 kernel's stored o), else the naive o.
Naive naive_attention(const VarCase& c, const Vec& q, const Vec& k, const Vec& v, const Vec& sinks, const Vec* dout,
                      const std::vector<int64_t>* starts, double scale, const Vec* o_seen = nullptr) {
  Naive r;
  r.o.assign(size_t(c.B * c.N * c.Sq * c.D), 0.0);
  r.lse.assign(size_t(c.B * c.N * c.Sq), 0.0);
  r.dq.assign(r.o.size(), 0.0);
  r.dk.assign(size_t(c.B * c.Nkv * c.Skv * c.D), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  r.dsinks.assign(size_t(c.N), 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t group = c.N / c.Nkv;
  Vec logit(size_t(c.Skv)), deriv(size_t(c.Skv)), p(size_t(c.Skv));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.N; ++h)
      for (int64_t i = 0; i < c.Sq; ++i) {
        const size_t qo = size_t(((b * c.N + h) * c.Sq + i) * c.D);
        const size_t kb = size_t((b * c.Nkv + h / group) * c.Skv * c.D);
        double mx = c.sinks ? sinks[size_t(h)] : -inf;
        for (int64_t j = 0; j < c.Skv; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d) dot += q[qo + size_t(d)] * k[kb + size_t(j * c.D + d)];
          double s = dot * scale, ds = scale;
          if (c.softcap > 0) {
            const double t = std::tanh(s / c.softcap);
            s = c.softcap * t, ds = scale * (1 - t * t);
          }
          logit[size_t(j)] = visible(c, starts, b, i, j) ? s : -inf;
          deriv[size_t(j)] = ds;
          mx = std::max(mx, logit[size_t(j)]);
        }
        const size_t row = size_t((b * c.N + h) * c.Sq + i);
        if (mx == -inf) {  // sees nothing, no sink: o = 0, lse = -inf, no gradient
          r.lse[row] = -inf;
          continue;
        }
        double sum = c.sinks ? std::exp(sinks[size_t(h)] - mx) : 0.0;
        for (int64_t j = 0; j < c.Skv; ++j) sum += (p[size_t(j)] = std::exp(logit[size_t(j)] - mx));
        r.lse[row] = mx + std::log(sum);
        for (int64_t j = 0; j < c.Skv; ++j) {
          p[size_t(j)] /= sum;
          for (int64_t d = 0; d < c.D; ++d) r.o[qo + size_t(d)] += p[size_t(j)] * v[kb + size_t(j * c.D + d)];
        }
        if (!dout) continue;
        double delta = 0;  // dout_i · o_i
        const Vec& o = o_seen ? *o_seen : r.o;
        for (int64_t d = 0; d < c.D; ++d) delta += (*dout)[qo + size_t(d)] * o[qo + size_t(d)];
        if (c.sinks) r.dsinks[size_t(h)] -= std::exp(sinks[size_t(h)] - r.lse[row]) * delta;
        for (int64_t j = 0; j < c.Skv; ++j) {
          if (p[size_t(j)] == 0) continue;
          const size_t ko = kb + size_t(j * c.D);
          double dp = 0;
          for (int64_t d = 0; d < c.D; ++d) dp += (*dout)[qo + size_t(d)] * v[ko + size_t(d)];
          const double draw = p[size_t(j)] * (dp - delta) * deriv[size_t(j)];  // dL / d(q·k)
          for (int64_t d = 0; d < c.D; ++d) {
            r.dv[ko + size_t(d)] += p[size_t(j)] * (*dout)[qo + size_t(d)];
            r.dq[qo + size_t(d)] += draw * k[ko + size_t(d)];
            r.dk[ko + size_t(d)] += draw * q[qo + size_t(d)];
          }
        }
      }
  return r;
}

std::vector<int64_t> document_starts(const VarCase& c) {
  std::vector<int64_t> starts(size_t(c.B * c.Sq));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t i = 0; i < c.Sq; ++i) starts[size_t(b * c.Sq + i)] = (i + b * 7) / c.doc_len * c.doc_len - b * 7;
  return starts;
}

struct Inputs {
  Vec q, k, v, dout, sinks;
};
Inputs inputs(const VarCase& c, uint32_t seed) {
  Inputs in{naive::random_normal(c.B * c.N * c.Sq * c.D, seed), naive::random_normal(c.B * c.Nkv * c.Skv * c.D, seed + 1),
            naive::random_normal(c.B * c.Nkv * c.Skv * c.D, seed + 2), naive::random_normal(c.B * c.N * c.Sq * c.D, seed + 3),
            naive::random_normal(c.N, seed + 4)};
  for (double& x : in.q) x *= 2;  // larger logits, so a softcap bends them
  return in;
}

template <class T>
AttentionVariant<T> variant_of(const VarCase& c, const std::vector<T>* sinks, std::vector<T>* dsinks) {
  return {.window = c.window, .softcap = c.softcap, .offset = c.offset,
          .sinks = c.sinks ? sinks->data() : nullptr, .dsinks = c.sinks ? dsinks->data() : nullptr};
}

}  // namespace

TEMPLATE_TEST_CASE("sdpa variants match the naive float64 attention", "[kernels][attention][variants]", float, double) {
  using T = TestType;
  uint32_t seed = 4200;
  for (const VarCase& c : kCases) {
    INFO("B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " Sq " << c.Sq << " Skv " << c.Skv << " D " << c.D
              << " window " << c.window << " softcap " << c.softcap << " sinks " << c.sinks << " offset " << c.offset
              << " documents " << c.doc_len);
    const double scale = 1.0 / std::sqrt(double(c.D));
    const Inputs in = inputs(c, seed);
    seed += 10;
    const auto starts = c.doc_len > 0 ? document_starts(c) : std::vector<int64_t>{};
    const std::vector<int64_t>* docs = c.doc_len > 0 ? &starts : nullptr;
    const auto q = test::cast<T>(in.q), k = test::cast<T>(in.k), v = test::cast<T>(in.v);
    const auto dout = test::cast<T>(in.dout), sinks = test::cast<T>(in.sinks);
    const Vec dout_seen = test::widen(dout);
    const Naive ref = naive_attention(c, test::widen(q), test::widen(k), test::widen(v), test::widen(sinks), &dout_seen,
                                      docs, scale);
    std::vector<T> dsinks(size_t(c.N), T(-777));
    const AttentionVariant<T> var = variant_of<T>(c, &sinks, &dsinks);
    std::vector<T> o(q.size(), T(-777)), lse(size_t(c.B * c.N * c.Sq), T(-777));
    cpu::sdpa_forward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale,
                         true, docs ? starts.data() : nullptr, var);
    test::check_close(o, ref.o);
    test::check_close(lse, ref.lse);

    std::vector<T> dq(q.size(), T(-777)), dk(k.size(), T(-777)), dv(v.size(), T(-777));
    cpu::sdpa_backward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                          dv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, true, docs ? starts.data() : nullptr,
                          nullptr, var);
    // Sums over up to w keys (and, for dk, dv, dsinks, over queries and heads): f32 to a few 1e-5.
    const double tol = sizeof(T) == 4 ? 3e-5 : 1e-11;
    test::check_close(dq, ref.dq, tol);
    test::check_close(dk, ref.dk, tol);
    test::check_close(dv, ref.dv, tol);
    if (c.sinks) test::check_close(dsinks, ref.dsinks, sizeof(T) == 4 ? 1e-4 : 1e-10);

    // A window that cuts, or a cap or sink, changes the result: plain causal attention is far from it.
    const Naive plain = naive_attention({c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, 0, 0, false, c.offset, c.doc_len},
                                        test::widen(q), test::widen(k), test::widen(v), {}, nullptr, docs, scale);
    double diff = 0;
    for (size_t i = 0; i < o.size(); ++i) diff = std::max(diff, std::abs(double(o[i]) - plain.o[i]));
    CHECK(diff > 1e-2);
  }
}

TEST_CASE("the naive variant attention's backward agrees with its own central differences",
          "[kernels][attention][variants]") {
  const VarCase c{1, 2, 1, 12, 12, 4, 5, 2.0, true, 0, 0};
  const double scale = 0.5, h = 1e-6;
  const Inputs in = inputs(c, 77);
  const Naive ref = naive_attention(c, in.q, in.k, in.v, in.sinks, &in.dout, nullptr, scale);
  // L = Σ dout · o; dL/dx by central differences for every element of q, k, v, sinks.
  const auto loss = [&](const Vec& q, const Vec& k, const Vec& v, const Vec& s) {
    const Naive r = naive_attention(c, q, k, v, s, nullptr, nullptr, scale);
    double sum = 0;
    for (size_t i = 0; i < r.o.size(); ++i) sum += in.dout[i] * r.o[i];
    return sum;
  };
  const auto fd = [&](int which) {
    Vec x[4] = {in.q, in.k, in.v, in.sinks};
    Vec g(x[which].size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double keep = x[which][i];
      x[which][i] = keep + h;
      const double up = loss(x[0], x[1], x[2], x[3]);
      x[which][i] = keep - h;
      g[i] = (up - loss(x[0], x[1], x[2], x[3])) / (2 * h);
      x[which][i] = keep;
    }
    return g;
  };
  test::check_close(test::cast<double>(ref.dq), fd(0), 1e-7);
  test::check_close(test::cast<double>(ref.dk), fd(1), 1e-7);
  test::check_close(test::cast<double>(ref.dv), fd(2), 1e-7);
  test::check_close(test::cast<double>(ref.dsinks), fd(3), 1e-7);
}

TEST_CASE("windowed attention skips the keys outside the window (it cannot read them)", "[kernels][attention][variants]") {
  // Keys far outside every query's window are NaN: a kernel that visits them (even masked
  // afterwards) would spread the NaN through its GEMMs. Queries [1024, 1100) with window 64 reach
  // back to key 961 at most; keys [0, 512) are never in reach.
  const int64_t S = 1100, D = 16, w = 64;
  auto q = test::cast<float>(naive::random_normal(S * D, 5));
  auto k = test::cast<float>(naive::random_normal(S * D, 6));
  auto v = test::cast<float>(naive::random_normal(S * D, 7));
  std::vector<float> o(q.size()), lse(static_cast<size_t>(S));
  std::vector<float> kq(k), vq(v);
  const AttentionVariant<float> var{.window = w};
  for (int64_t j = 0; j < 512 * D; ++j) kq[size_t(j)] = vq[size_t(j)] = std::numeric_limits<float>::quiet_NaN();
  const int64_t Sq = 76;  // the last 76 queries against all 1100 keys (bottom-right aligned)
  cpu::sdpa_forward<float>(q.data(), kq.data(), vq.data(), o.data(), lse.data(), 1, 1, 1, Sq, S, D, 0.25, true, nullptr,
                           var);
  for (int64_t i = 0; i < Sq * D; ++i) REQUIRE(std::isfinite(o[size_t(i)]));
}

namespace {

// Rounds x to bf16 in place; returns the bf16 bits.
std::vector<uint16_t> round_to_bf16(Vec& x) {
  const std::vector<uint16_t> b = test::to_bf16(x);
  x = test::widen_bf16(b);
  return b;
}

// The tile products' paths of the bf16 attention this CPU runs: AVX512-BF16, AMX where it has the
// tiles, and the AMX code on the software tiles (every CPU with AVX-512; slow, so `small` cases).
std::vector<cpu::Bf16Gemm> attention_paths() {
  std::vector<cpu::Bf16Gemm> paths;
  for (cpu::Bf16Gemm p : {cpu::Bf16Gemm::avx512_bf16, cpu::Bf16Gemm::amx, cpu::Bf16Gemm::amx_emulated})
    if (cpu::bf16_gemm_available(p)) paths.push_back(p);
  if (!cpu::bf16_gemm_available(cpu::Bf16Gemm::amx)) WARN("SKIPPED: the bf16 attention on AMX tiles (this CPU has none)");
  return paths;
}

}  // namespace

TEST_CASE("bf16 sdpa on the bf16 units matches the naive float64 attention", "[kernels][attention][variants][bf16]") {
  if (!cpu::sdpa_bf16_native(16)) {
    WARN("SKIPPED: the bf16 attention's tile products (this CPU lacks AVX512-BF16)");
    return;
  }
  std::vector<VarCase> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({1, 4, 2, 700, 700, 64, 0, 0, false, 0, 0});   // plain GQA across the 128 × 512 and 64 × 256 tiles
  cases.push_back({2, 2, 1, 131, 131, 6, 0, 0, false, 0, 0});    // D = 6: the columns past 16·k plainly; odd rows
  cases.push_back({1, 2, 2, 257, 257, 128, 0, 0, false, 0, 57}); // D = 128, documents, odd key blocks
  cases.push_back({1, 2, 1, 200, 200, 40, 0, 0, false, 0, 0});   // D = 40: 20 pairs, a partial AMX tile of depth
  for (const cpu::Bf16Gemm path : attention_paths())
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const VarCase& c = cases[ci];
    const uint32_t seed = 9100 + 10 * uint32_t(ci);  // each case's inputs, the same on every path
    // The software tiles take ~1 µs per tile product: the cases up to 300 queries (every variant).
    if (path == cpu::Bf16Gemm::amx_emulated && c.Sq * c.N * c.B > 1200) continue;
    INFO("path " << cpu::bf16_gemm_name(path));
    INFO("B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " Sq " << c.Sq << " Skv " << c.Skv << " D " << c.D
              << " window " << c.window << " softcap " << c.softcap << " sinks " << c.sinks << " offset " << c.offset
              << " documents " << c.doc_len);
    const double scale = 1.0 / std::sqrt(double(c.D));
    Inputs in = inputs(c, seed);
    const auto q = round_to_bf16(in.q), k = round_to_bf16(in.k), v = round_to_bf16(in.v), dout = round_to_bf16(in.dout);
    const auto sinks = test::cast<float>(in.sinks);
    in.sinks = test::widen(sinks);
    const auto starts = c.doc_len > 0 ? document_starts(c) : std::vector<int64_t>{};
    const std::vector<int64_t>* docs = c.doc_len > 0 ? &starts : nullptr;
    std::vector<float> dsinks(size_t(c.N), -777.0f);
    const AttentionVariant<float> var = variant_of<float>(c, &sinks, &dsinks);
    std::vector<uint16_t> o(q.size(), 0xffff);
    std::vector<float> lse(size_t(c.B * c.N * c.Sq), -777.0f);
    cpu::sdpa_forward_bf16(q.data(), k.data(), v.data(), o.data(), lse.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale,
                           true, docs ? starts.data() : nullptr, var, path);
    const double tol = 1e-2;
    const Vec o_seen = test::widen_bf16(o);  // the backward reads o as stored (as the CUDA tests' reference does)
    const Naive ref = naive_attention(c, in.q, in.k, in.v, in.sinks, &in.dout, docs, scale, &o_seen);
    test::check_close(o_seen, ref.o, tol);
    test::check_close(lse, ref.lse, 1e-3);  // f32, from scores of bf16 values: only f32 sums
    std::vector<uint16_t> dq(q.size(), 0xffff), dk(k.size(), 0xffff), dv(v.size(), 0xffff);
    cpu::sdpa_backward_bf16(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                            dv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, true, docs ? starts.data() : nullptr,
                            nullptr, var, path);
    test::check_close(test::widen_bf16(dq), ref.dq, tol);
    test::check_close(test::widen_bf16(dk), ref.dk, tol);
    test::check_close(test::widen_bf16(dv), ref.dv, tol);
    if (c.sinks) test::check_close(dsinks, ref.dsinks, tol);
    const double e = std::max({test::relative_l2(test::widen_bf16(o), ref.o), test::relative_l2(test::widen_bf16(dq), ref.dq),
                               test::relative_l2(test::widen_bf16(dk), ref.dk), test::relative_l2(test::widen_bf16(dv), ref.dv)});
    INFO("largest relative L2 error " << e);
    CHECK(e <= 5e-3);
  }
}

// The bf16 kernels' f32 outputs (O = float: what ring attention sums its chunk pairs in, decision
// 284) are their bf16 outputs before the rounding: dq, dk, dv round to the bf16 outputs' bits (both
// round the same f32 sums), o to within half a bf16 ulp (the bf16 o is rounded from the double
// quotient, so f32 then bf16 may round a tie the other way), lse and dsinks are the same; and the
// f32 outputs match the naive float64 attention. On ring pairs (offsets), several backward chunks
// (S 700: the last chunk's sums then start dk, dv in place), documents, and every variant at once,
// with and without the workspace. The gradients' element bar is the ring test's (check_ring_op in
// tests/comm/test_thread_ring.cpp), not sdpa's 1e-2, which one element on these values exceeds.
TEST_CASE("bf16 sdpa's f32 outputs are its bf16 outputs before their rounding", "[kernels][attention][variants][bf16]") {
  if (!cpu::sdpa_bf16_native(8)) {
    WARN("SKIPPED: the bf16 attention's tile products (this CPU lacks AVX512-BF16)");
    return;
  }
  const VarCase cases[] = {
      {1, 2, 1, 64, 64, 8, 50, 3.0, true, 64, 0},         // a ring pair: keys 64 before the queries
      {1, 1, 1, 40, 40, 8, 20, 0, true, 30, 0},           // offset: the window reaches into the chunk
      {2, 4, 2, 600, 600, 16, 128, 2.0, true, 0, 0},      // window, softcap and sinks
      {1, 4, 2, 700, 700, 64, 0, 0, false, 0, 0},         // several backward chunks
      {1, 2, 2, 257, 257, 128, 0, 0, false, 0, 57},       // D = 128, documents
  };
  for (const VarCase& c : cases)
    for (const bool planned : {false, true}) {
      if (planned && c.offset != 0) continue;  // a ring pair (an offset) brings no workspace
      INFO("B " << c.B << " N " << c.N << " Nkv " << c.Nkv << " S " << c.Sq << " D " << c.D << " window " << c.window
                << " softcap " << c.softcap << " sinks " << c.sinks << " offset " << c.offset << " documents "
                << c.doc_len << " workspace " << planned);
      const double scale = 1.0 / std::sqrt(double(c.D));
      Inputs in = inputs(c, 9400);
      const auto q = round_to_bf16(in.q), k = round_to_bf16(in.k), v = round_to_bf16(in.v), dout = round_to_bf16(in.dout);
      const auto sinks = test::cast<float>(in.sinks);
      in.sinks = test::widen(sinks);
      const auto starts = c.doc_len > 0 ? document_starts(c) : std::vector<int64_t>{};
      const int64_t* docs = c.doc_len > 0 ? starts.data() : nullptr;
      std::vector<float> ws(planned ? size_t(cpu::sdpa_backward_bf16_workspace(c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, true))
                                    : 0, NAN);
      float* workspace = planned ? ws.data() : nullptr;
      std::vector<float> ds16(size_t(c.N), -777.0f), ds32(size_t(c.N), -777.0f);
      std::vector<uint16_t> o16(q.size()), dq16(q.size()), dk16(k.size()), dv16(v.size());
      std::vector<float> o32(q.size(), NAN), dq32(q.size(), NAN), dk32(k.size(), NAN), dv32(v.size(), NAN);
      std::vector<float> lse16(size_t(c.B * c.N * c.Sq)), lse32(lse16.size());
      cpu::sdpa_forward_bf16(q.data(), k.data(), v.data(), o16.data(), lse16.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D,
                             scale, true, docs, variant_of<float>(c, &sinks, &ds16));
      cpu::sdpa_forward_bf16(q.data(), k.data(), v.data(), o32.data(), lse32.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D,
                             scale, true, docs, variant_of<float>(c, &sinks, &ds32));
      // Both backwards read the stored bf16 o (as a ring's backward reads the node's o).
      cpu::sdpa_backward_bf16(q.data(), k.data(), v.data(), o16.data(), lse16.data(), dout.data(), dq16.data(),
                              dk16.data(), dv16.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, true, docs, workspace,
                              variant_of<float>(c, &sinks, &ds16));
      cpu::sdpa_backward_bf16(q.data(), k.data(), v.data(), o16.data(), lse16.data(), dout.data(), dq32.data(),
                              dk32.data(), dv32.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, true, docs, workspace,
                              variant_of<float>(c, &sinks, &ds32));
      const auto rounded = [](const std::vector<float>& x) {
        std::vector<uint16_t> b(x.size());
        for (size_t i = 0; i < x.size(); ++i) b[i] = cpu::f32_to_bf16(x[i]);
        return b;
      };
      CHECK(rounded(dq32) == dq16);
      CHECK(rounded(dk32) == dk16);
      CHECK(rounded(dv32) == dv16);
      CHECK(lse32 == lse16);
      if (c.sinks) CHECK(ds32 == ds16);
      double o_off = 0;  // |o16 - o32| in half bf16 ulps of o16 (f32's own rounding allowed for)
      for (size_t i = 0; i < o32.size(); ++i) {
        const double b = cpu::bf16_to_f32(o16[i]), half_ulp = std::ldexp(1.0, std::ilogb(b == 0 ? 1e-30 : b) - 8);
        o_off = std::max(o_off, std::abs(b - double(o32[i])) / (half_ulp + std::ldexp(std::abs(double(o32[i])), -24)));
      }
      CHECK(o_off <= 1.0);
      const Vec o_seen = test::widen_bf16(o16);
      const Naive ref = naive_attention(c, in.q, in.k, in.v, in.sinks, &in.dout, docs ? &starts : nullptr, scale, &o_seen);
      test::check_close(o32, ref.o, 1e-2);
      test::check_close(dq32, ref.dq, 1.25e-2);  // measured 1.12e-2 on these values (products' rounding of P, dS)
      test::check_close(dk32, ref.dk, 1.25e-2);
      test::check_close(dv32, ref.dv, 1.25e-2);
    }
}

TEST_CASE("bf16 sdpa without causal masking, and with the planned workspace, matches the naive attention",
          "[kernels][attention][bf16]") {
  if (!cpu::sdpa_bf16_native(32)) {
    WARN("SKIPPED: the bf16 attention's tile products (this CPU lacks AVX512-BF16)");
    return;
  }
  const int64_t B = 1, N = 4, Nkv = 2, Sq = 300, Skv = 333, D = 32;  // Sq ≠ Skv: keys past one tile
  const double scale = 0.2;
  Vec qd = naive::random_normal(B * N * Sq * D, 31), kd = naive::random_normal(B * Nkv * Skv * D, 32);
  Vec vd = naive::random_normal(B * Nkv * Skv * D, 33), dod = naive::random_normal(B * N * Sq * D, 34);
  const auto q = round_to_bf16(qd), k = round_to_bf16(kd), v = round_to_bf16(vd), dout = round_to_bf16(dod);
  for (const cpu::Bf16Gemm path : attention_paths())
  for (const bool causal : {false, true}) {
    INFO("path " << cpu::bf16_gemm_name(path) << " causal " << causal);
    Vec rlse, rdq, rdk, rdv;
    const Vec ro = naive::sdpa(qd, kd, vd, B, N, Nkv, Sq, Skv, D, scale, causal, &rlse);
    naive::sdpa_backward(qd, kd, vd, dod, B, N, Nkv, Sq, Skv, D, scale, causal, rdq, rdk, rdv);
    std::vector<uint16_t> o(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<float> lse(size_t(B * N * Sq));
    cpu::sdpa_forward_bf16(q.data(), k.data(), v.data(), o.data(), lse.data(), B, N, Nkv, Sq, Skv, D, scale, causal,
                           nullptr, {}, path);
    std::vector<float> workspace(size_t(cpu::sdpa_backward_bf16_workspace(B, N, Nkv, Sq, Skv, D, causal)), NAN);
    cpu::sdpa_backward_bf16(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                            dv.data(), B, N, Nkv, Sq, Skv, D, scale, causal, nullptr, workspace.data(), {}, path);
    test::check_close(test::widen_bf16(o), ro, 1e-2);
    test::check_close(lse, rlse, 1e-3);
    test::check_close(test::widen_bf16(dq), rdq, 1e-2);
    test::check_close(test::widen_bf16(dk), rdk, 1e-2);
    test::check_close(test::widen_bf16(dv), rdv, 1e-2);
  }
}

TEST_CASE("bf16 sdpa on the AMX hardware gives the software tiles' bits", "[kernels][attention][bf16][amx]") {
  if (!cpu::bf16_gemm_available(cpu::Bf16Gemm::amx) || !cpu::sdpa_bf16_native(128)) {
    WARN("SKIPPED: the bf16 attention on AMX tiles (this CPU has none)");
    return;
  }
  const VarCase c{1, 2, 2, 257, 257, 128, 0, 0, false, 0, 57};  // D = 128, documents, odd key blocks
  const double scale = 1.0 / std::sqrt(double(c.D));
  Inputs in = inputs(c, 9300);
  const auto q = round_to_bf16(in.q), k = round_to_bf16(in.k), v = round_to_bf16(in.v), dout = round_to_bf16(in.dout);
  const auto starts = document_starts(c);
  struct Out {
    std::vector<uint16_t> o, dq, dk, dv;
    std::vector<float> lse;
  };
  auto run = [&](cpu::Bf16Gemm path) {
    Out r{std::vector<uint16_t>(q.size()), std::vector<uint16_t>(q.size()), std::vector<uint16_t>(k.size()),
          std::vector<uint16_t>(v.size()), std::vector<float>(size_t(c.B * c.N * c.Sq))};
    cpu::sdpa_forward_bf16(q.data(), k.data(), v.data(), r.o.data(), r.lse.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D,
                           scale, true, starts.data(), {}, path);
    cpu::sdpa_backward_bf16(q.data(), k.data(), v.data(), r.o.data(), r.lse.data(), dout.data(), r.dq.data(),
                            r.dk.data(), r.dv.data(), c.B, c.N, c.Nkv, c.Sq, c.Skv, c.D, scale, true, starts.data(),
                            nullptr, {}, path);
    return r;
  };
  const Out hw = run(cpu::Bf16Gemm::amx), model = run(cpu::Bf16Gemm::amx_emulated);
  CHECK(hw.o == model.o);
  CHECK(hw.lse == model.lse);
  CHECK(hw.dq == model.dq);
  CHECK(hw.dk == model.dk);
  CHECK(hw.dv == model.dv);
}
