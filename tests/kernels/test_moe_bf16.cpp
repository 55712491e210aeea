// The CPU grouped expert MLP on bf16 (kernels/cpu/moe_bf16.h) on every bf16 GEMM path this CPU
// has: the output against the float64 naive per-token loop (tests/common/naive.h moe_experts) and
// the gradients against the float64 kernel (tests/kernels/test_moe.cpp checks that one against
// central differences of the naive loop), all on the same bf16 values, within the bf16 kernels'
// relative L2 bound (test_mlp.cpp's); an expert no token chose gets zero gradients; an expert with
// more rows than kMlpChunkRows runs two chunks; the bits do not depend on the thread count.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "bf16_test.h"
#include "common/naive.h"
#include "kernel_test.h"
#include "moe_test.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/moe_bf16.h"
#include "kernels/kinds.h"

namespace {

using namespace autosp;
using test::experts;
using test::experts_const;

struct Case {
  int64_t R, C, E, I, k;
  bool norm;
};

// One layer's values rounded to bf16 (the last expert gets no token unless `all_experts`).
struct Layer {
  Case s;
  std::vector<uint16_t> x, probs, wg, wu, wd, dy;
  Layer(const Case& c, uint32_t seed, bool all_experts) : s(c) {
    naive::Vec logits = naive::random_normal(c.R * c.E, seed + 1);
    if (!all_experts)
      for (int64_t r = 0; r < c.R; ++r) logits[r * c.E + c.E - 1] = -30;
    x = test::to_bf16(naive::random_normal(c.R * c.C, seed));
    probs = test::to_bf16(naive::softmax(logits, c.R, c.E));
    wg = test::to_bf16(naive::random_normal(c.E * c.I * c.C, seed + 2, 0.3));
    wu = test::to_bf16(naive::random_normal(c.E * c.I * c.C, seed + 3, 0.3));
    wd = test::to_bf16(naive::random_normal(c.E * c.C * c.I, seed + 4, 0.3));
    dy = test::to_bf16(naive::random_normal(c.R * c.C, seed + 5));
  }
};

struct Out {
  std::vector<uint16_t> y, dx, dp, dwg, dwu, dwd;
};

Out run_bf16(cpu::Bf16Gemm path, Layer& l) {
  const Case& c = l.s;
  Out o{std::vector<uint16_t>(l.x.size()), std::vector<uint16_t>(l.x.size()), std::vector<uint16_t>(l.probs.size()),
        std::vector<uint16_t>(l.wg.size(), 0x7fc0), std::vector<uint16_t>(l.wu.size(), 0x7fc0),
        std::vector<uint16_t>(l.wd.size(), 0x7fc0)};  // NaN: every gradient must be written
  const auto g = experts_const(l.wg, c.E), u = experts_const(l.wu, c.E), d = experts_const(l.wd, c.E);
  cpu::moe_experts_forward_bf16(path, l.x.data(), l.probs.data(), g.data(), u.data(), d.data(), o.y.data(), c.R, c.C,
                                c.E, c.I, c.k, c.norm);
  cpu::moe_experts_backward_bf16(path, l.dy.data(), l.x.data(), l.probs.data(), g.data(), u.data(), d.data(),
                                 o.dx.data(), o.dp.data(), experts(o.dwg, c.E).data(), experts(o.dwu, c.E).data(),
                                 experts(o.dwd, c.E).data(), c.R, c.C, c.E, c.I, c.k, c.norm);
  return o;
}

}  // namespace

TEST_CASE("moe_experts on bf16 matches the float64 loop and kernel within bf16 rounding", "[kernels][moe][bf16]") {
  const std::vector<Case> cases = {
      {37, 32, 6, 48, 2, true},   // Mixtral's renormalised top 2; the last expert gets no token
      {37, 32, 6, 48, 1, false},  // Qwen's raw top-1 weight
      {41, 40, 4, 24, 3, false},  // top 3 of 4
  };
  test::for_each_bf16_path([&](cpu::Bf16Gemm path) {
    for (const Case& c : cases) {
      INFO("R " << c.R << " C " << c.C << " E " << c.E << " I " << c.I << " top_k " << c.k << " norm " << c.norm);
      Layer l(c, 70, false);
      const Out o = run_bf16(path, l);
      // The references on the same bf16 values, in float64.
      naive::Vec x = test::widen_bf16(l.x), p = test::widen_bf16(l.probs), wg = test::widen_bf16(l.wg),
                 wu = test::widen_bf16(l.wu), wd = test::widen_bf16(l.wd), dy = test::widen_bf16(l.dy);
      const naive::Vec y = naive::moe_experts(x, p, wg, wu, wd, c.R, c.C, c.E, c.I, c.k, c.norm);
      naive::Vec dx(x.size()), dp(p.size()), dwg(wg.size()), dwu(wu.size()), dwd(wd.size());
      const auto cg = experts_const(wg, c.E), cu = experts_const(wu, c.E), cd = experts_const(wd, c.E);
      cpu::moe_experts_backward<double>(dy.data(), x.data(), p.data(), cg.data(), cu.data(), cd.data(), dx.data(),
                                        dp.data(), experts(dwg, c.E).data(), experts(dwu, c.E).data(),
                                        experts(dwd, c.E).data(), c.R, c.C, c.E, c.I, c.k, c.norm);
      const double e_y = test::relative_l2(test::widen_bf16(o.y), y);
      const double e_dx = test::relative_l2(test::widen_bf16(o.dx), dx);
      const double e_dp = test::relative_l2(test::widen_bf16(o.dp), dp);
      const double e_dwg = test::relative_l2(test::widen_bf16(o.dwg), dwg);
      const double e_dwu = test::relative_l2(test::widen_bf16(o.dwu), dwu);
      const double e_dwd = test::relative_l2(test::widen_bf16(o.dwd), dwd);
      INFO("relative L2 error of y " << e_y << ", dx " << e_dx << ", dprobs " << e_dp << ", dWg " << e_dwg << ", dWu "
                                     << e_dwu << ", dWd " << e_dwd);
      CHECK(std::max({e_y, e_dx, e_dp, e_dwg, e_dwu, e_dwd}) <= 5e-3);
      // The expert no token chose: zero gradients, written (the buffers held NaN).
      const int64_t e = c.E - 1, n = c.I * c.C;
      for (const std::vector<uint16_t>* dw : {&o.dwg, &o.dwu, &o.dwd})
        CHECK(std::all_of(dw->begin() + e * n, dw->begin() + (e + 1) * n, [](uint16_t v) { return v == 0; }));
    }
  });
}

TEST_CASE("moe_experts on bf16: two chunks of an expert's rows, and the same bits at any thread count",
          "[kernels][moe][bf16]") {
  // Top 1 of 2 experts over 2,600 tokens: each expert gets more than kMlpChunkRows (1,024) rows.
  const Case c{2600, 16, 2, 24, 1, true};
  Layer l(c, 90, true);
  const cpu::Bf16Gemm path = cpu::bf16_gemm_best();
  INFO("path " << cpu::bf16_gemm_name(path));
  Out first;
  test::with_threads({1, 2}, [&](int t) {
    INFO("threads " << t);
    Out o = run_bf16(path, l);
    if (t == 1) {
      naive::Vec x = test::widen_bf16(l.x), p = test::widen_bf16(l.probs), wg = test::widen_bf16(l.wg),
                 wu = test::widen_bf16(l.wu), wd = test::widen_bf16(l.wd), dy = test::widen_bf16(l.dy);
      naive::Vec dx(x.size()), dp(p.size()), dwg(wg.size()), dwu(wu.size()), dwd(wd.size());
      const auto cg = experts_const(wg, c.E), cu = experts_const(wu, c.E), cd = experts_const(wd, c.E);
      int64_t first_expert = 0;  // the rows top-1 sends to expert 0
      for (int64_t r = 0; r < c.R; ++r) first_expert += p[size_t(2 * r)] > p[size_t(2 * r + 1)];
      REQUIRE(std::min(first_expert, c.R - first_expert) > kernels::kMlpChunkRows);
      cpu::moe_experts_backward<double>(dy.data(), x.data(), p.data(), cg.data(), cu.data(), cd.data(), dx.data(),
                                        dp.data(), experts(dwg, c.E).data(), experts(dwu, c.E).data(),
                                        experts(dwd, c.E).data(), c.R, c.C, c.E, c.I, c.k, c.norm);
      CHECK(test::relative_l2(test::widen_bf16(o.y), naive::moe_experts(x, p, wg, wu, wd, c.R, c.C, c.E, c.I, c.k,
                                                                        c.norm)) <= 5e-3);
      CHECK(test::relative_l2(test::widen_bf16(o.dx), dx) <= 5e-3);
      CHECK(test::relative_l2(test::widen_bf16(o.dwg), dwg) <= 5e-3);
      CHECK(test::relative_l2(test::widen_bf16(o.dwd), dwd) <= 5e-3);
      first = std::move(o);
      return;
    }
    CHECK(o.y == first.y);
    CHECK(o.dx == first.dx);
    CHECK(o.dp == first.dp);
    CHECK(o.dwg == first.dwg);
    CHECK(o.dwu == first.dwu);
    CHECK(o.dwd == first.dwd);
  });
}
