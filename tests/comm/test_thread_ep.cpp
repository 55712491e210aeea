// Expert parallelism (moe.expert_parallel_size G; graph/passes/expert_parallel.h,
// engine/expert_parallel.h) with ranks as threads: each rank holds 1/G of every MoE layer's
// experts, and the loss and every gradient equal the unsharded one-process run on the same global
// batch (tests/common/sp_case.h's reference and tolerance) for Mixtral, Qwen2-MoE (shared expert)
// and Qwen3-MoE, with G = 2 and 4 under Ulysses SP, Ulysses × ring, dp × sp and activation
// checkpointing. Dense gradients are summed over the world, a local expert's over the ranks that
// hold the same experts (the "ep_replica" group), as the trainer does.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "comm/threads.h"
#include "common/ep_case.h"
#include "common/naive.h"
#include "engine/expert_parallel.h"
#include "graph/builder.h"
#include "graph/passes/expert_parallel.h"
#include "kernels/cpu/moe.h"

namespace autosp::test {
namespace {

// Every rank's result of the layout's programs, run as threads, each checked against `ref`.
void check_layout(const json& model, const EpLayout& l, const Batch& global, const ParamMap& params,
                  const LossAndGrads& ref) {
  std::vector<LossAndGrads> out(static_cast<size_t>(l.world));
  run_thread_ranks(l.world, [&](ThreadCommunicator& w) {
    out[static_cast<size_t>(w.rank())] = run_ep_rank(w, model, l, global, params);
  });
  for (int r = 0; r < l.world; ++r) check_ep_rank(out[static_cast<size_t>(r)], r, l, ref);
}

}  // namespace

TEST_CASE("thread ep: G = 2 and 4 equal one process for the three MoE families under Ulysses, ring and dp x sp",
          "[threads][moe][ep]") {
  for (const json& model : {kMixtral, kQwen2Moe, kQwen3Moe}) {
    const EpCase c = ep_case(model);
    for (const EpLayout& l : ep_layouts()) {
      INFO(model_name(model) << ": " << describe(l));
      check_layout(model, l, c.global, c.params, c.ref);
    }
  }
}

// Through train() (ZeRO 0: train/train_state.cpp ReplicatedState over ParamGroups): the loss and gradient norm of every
// step and the final whole parameters (each expert broadcast from its owner) equal the one-process
// run's, so the expert-replica all-reduce, the norm over the expert group and the AdamW update of
// the local experts are those of one process.
TEST_CASE("thread ep: train() with G = 2 and 4 gives the one-process losses, norms and final weights",
          "[threads][moe][ep]") {
  const json opt = {{"steps", 4}, {"lr", 1e-2}, {"warmup_steps", 1}, {"min_lr", 1e-4}, {"grad_clip", 0.5}};
  const TrainResult ref = train_one_process(kQwen2Moe, opt);
  REQUIRE(ref.steps.size() == 4);
  for (const int P : {2, 4}) {
    std::vector<TrainResult> got(static_cast<size_t>(P));
    run_thread_ranks(P, [&](ThreadCommunicator& w) {
      got[static_cast<size_t>(w.rank())] = train(ep_train_config(kQwen2Moe, {P, P, 1, P}, 0, opt), quiet_args(), w);
    });
    for (const auto& rank : got) {
      INFO("P = G = " << P);
      check_train_like(rank, ref);
    }
  }
}

// The pass itself: the rank's forward holds moe_experts_ep over its own experts only, and the
// other experts' parameters are gone from the graph (what --plan-memory counts).
TEST_CASE("thread ep: expert_parallel keeps this rank's experts and erases the others' parameters", "[moe][ep]") {
  Config cfg = make_config(kMixtral, 2);
  cfg.moe.expert_parallel_size = 2;
  const RankProgram p = build_program(cfg, DType::f32, Stage::rank_forward, rank_layout(2, 1, 2, 1, 2));
  int ep_nodes = 0;
  for (const auto& n : p.graph->nodes()) {
    CHECK(n->op() != Op::moe_experts);
    if (n->op() != Op::moe_experts_ep) continue;
    ++ep_nodes;
    CHECK(n->attrs().s("group") == "ep");
    CHECK(n->attrs().i("group_size") == 2);
    CHECK(n->inputs().size() == 2 + 3 * 2);
  }
  CHECK(ep_nodes == 2);
  for (int e = 0; e < 4; ++e) {
    const std::string w = "model.layers.0.block_sparse_moe.experts." + std::to_string(e) + ".w1.weight";
    INFO(w);
    CHECK((p.graph->find(w) != nullptr) == (e >= 2));  // ep rank 1 of 2 holds experts 2 and 3
  }
}

// gpt-oss's experts (per-expert biases, the clamped SwiGLU: kernels/kinds.h MoeOptions) through
// the exchange itself (engine/expert_parallel.h): G = 2 and 4 ranks, each with its R / G tokens and
// its E / G experts' weights and biases, give the one-process kernel's output, dx and dprobs on
// their tokens and, for their experts, the weight and bias gradients (the whole batch's: the
// expert group is the world here). The owner applies the biases and the activation.
TEST_CASE("thread ep: gpt-oss experts (biases, clamped SwiGLU) over G = 2 and 4 equal one process",
          "[threads][moe][ep]") {
  const int64_t R = 24, C = 6, E = 4, I = 5, k = 2;
  const naive::Vec x = naive::random_normal(R * C, 800), dy = naive::random_normal(R * C, 801);
  const naive::Vec probs = naive::softmax(naive::random_normal(R * E, 802), R, E);
  // the parameters of every expert, in the op's input order: gates, ups, downs, b_gates, b_ups, b_downs
  std::vector<naive::Vec> params;
  for (int which = 0; which < 6; ++which)
    for (int64_t e = 0; e < E; ++e)
      params.push_back(naive::random_normal(which < 3 ? I * C : which < 5 ? I : C, 810 + uint32_t(which * E + e), 0.5));
  // The kernel's pointer arrays over experts [e0, e0 + n) of `params` (and of `grads`, when given).
  struct Arrays {
    std::vector<const double*> p[6];
    std::vector<double*> g[6];
    kernels::MoeOptions<double> opt;
    Arrays(std::vector<naive::Vec>& params, std::vector<naive::Vec>* grads, int64_t e0, int64_t n, int64_t E) {
      for (int which = 0; which < 6; ++which)
        for (int64_t e = e0; e < e0 + n; ++e) {
          p[which].push_back(params[size_t(which * E + e)].data());
          if (grads) g[which].push_back((*grads)[size_t(which * E + e)].data());
        }
      opt = {.b_gate = p[3].data(), .b_up = p[4].data(), .b_down = p[5].data(), .clamped = true, .alpha = 1.702,
             .limit = 1.0};
      if (grads) opt.db_gate = g[3].data(), opt.db_up = g[4].data(), opt.db_down = g[5].data();
    }
  };
  auto zeros_like = [](const std::vector<naive::Vec>& v) {
    std::vector<naive::Vec> z;
    for (const auto& t : v) z.emplace_back(t.size(), 0.0);
    return z;
  };
  // One process.
  std::vector<naive::Vec> all = params, dall = zeros_like(params);
  naive::Vec y(size_t(R * C)), dx(size_t(R * C)), dp(size_t(R * E));
  {
    Arrays a(all, &dall, 0, E, E);
    cpu::moe_experts_forward<double>(x.data(), probs.data(), a.p[0].data(), a.p[1].data(), a.p[2].data(), y.data(), R, C,
                                     E, I, k, true, a.opt);
    cpu::moe_experts_backward<double>(dy.data(), x.data(), probs.data(), a.p[0].data(), a.p[1].data(), a.p[2].data(),
                                      dx.data(), dp.data(), a.g[0].data(), a.g[1].data(), a.g[2].data(), R, C, E, I, k,
                                      true, a.opt);
  }
  auto close = [](const double* got, const double* want, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (1 + std::abs(want[i])));
    return worst;
  };
  for (const int G : {2, 4}) {
    const int64_t Rg = R / G, L = E / G;
    const size_t ranks = static_cast<size_t>(G);
    std::vector<std::vector<naive::Vec>> grads(ranks);
    std::vector<naive::Vec> ys(ranks), dxs(ranks), dps(ranks);
    run_thread_ranks(G, [&](ThreadCommunicator& w) {
      const int g = w.rank();
      std::vector<naive::Vec> mine = params;
      std::vector<naive::Vec>& dmine = grads[size_t(g)] = zeros_like(params);
      Arrays a(mine, &dmine, g * L, L, E);
      const double *xg = x.data() + g * Rg * C, *dyg = dy.data() + g * Rg * C, *pg = probs.data() + g * Rg * E;
      naive::Vec& yg = ys[size_t(g)] = naive::Vec(size_t(Rg * C));
      naive::Vec& dxg = dxs[size_t(g)] = naive::Vec(size_t(Rg * C));
      naive::Vec& dpg = dps[size_t(g)] = naive::Vec(size_t(Rg * E));
      moe_ep_forward<double>(w, cpu_allocator(), xg, pg, a.p[0].data(), a.p[1].data(), a.p[2].data(), yg.data(), Rg,
                             C, E, I, k, true, a.opt);
      moe_ep_backward<double>(w, cpu_allocator(), dyg, xg, pg, a.p[0].data(), a.p[1].data(), a.p[2].data(),
                              dxg.data(), dpg.data(), a.g[0].data(), a.g[1].data(), a.g[2].data(), Rg, C, E, I, k,
                              true, a.opt);
    });
    for (int g = 0; g < G; ++g) {
      INFO("G = " << G << ", rank " << g);
      CHECK(close(ys[size_t(g)].data(), y.data() + g * Rg * C, Rg * C) < 1e-12);
      CHECK(close(dxs[size_t(g)].data(), dx.data() + g * Rg * C, Rg * C) < 1e-12);
      CHECK(close(dps[size_t(g)].data(), dp.data() + g * Rg * E, Rg * E) < 1e-12);
      for (int which = 0; which < 6; ++which)
        for (int64_t e = g * L; e < (g + 1) * L; ++e) {
          INFO("parameter " << which << " of expert " << e);
          const naive::Vec& got = grads[size_t(g)][size_t(which * E + e)];
          const naive::Vec& want = dall[size_t(which * E + e)];
          CHECK(close(got.data(), want.data(), int64_t(want.size())) < 1e-12);
        }
    }
  }
}

// The pass keeps a gpt-oss layer's biases and activation with its experts: rank g holds its
// experts' weights and biases (6 · E / G parameter inputs) and the attributes the owner applies.
TEST_CASE("thread ep: expert_parallel keeps gpt-oss's biases and activation with the rank's experts", "[moe][ep]") {
  Graph g;
  Builder b(g);
  const Dim B = Dim::sym("B"), S = Dim::sym("S");
  Node* x = b.input("x", DType::f32, {B, S, 6}, Role::none);
  Node* probs = b.input("probs", DType::f32, {B, S, 4}, Role::none);
  std::vector<Node*> w[6];
  const char* kinds[] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight",
                         "gate_proj.bias", "up_proj.bias", "down_proj.bias"};
  for (int which = 0; which < 6; ++which)
    for (int e = 0; e < 4; ++e) {
      const SymShape shape = which < 2 ? SymShape{5, 6} : which == 2 ? SymShape{6, 5} : which < 5 ? SymShape{5} : SymShape{6};
      w[which].push_back(b.parameter("model.layers.0.mlp.experts." + std::to_string(e) + "." + kinds[which], DType::f32,
                                     shape));
    }
  const MoeExpertOptions opt{w[3], w[4], w[5], MoeActivation::clamped_swiglu, 1.702, 7.0};
  g.add_output(b.moe_experts(x, probs, w[0], w[1], w[2], 2, true, "experts", opt));
  PassContext ctx;
  ctx.ep_size = 2, ctx.ep_rank = 1;
  passes::expert_parallel(g, ctx);
  int ep_nodes = 0;
  for (const auto& n : g.nodes()) {
    if (n->op() != Op::moe_experts_ep) continue;
    ++ep_nodes;
    CHECK(n->inputs().size() == 2 + 6 * 2);
    CHECK(moe_biased(*n));
    CHECK(moe_clamped(*n));
    CHECK(n->attrs().f("limit") == 7.0);
    for (size_t i = 2; i < n->inputs().size(); ++i) CHECK(expert_of(n->input(i)->name()) >= 2);  // experts 2, 3
  }
  CHECK(ep_nodes == 1);
  for (int which = 0; which < 6; ++which)
    for (int e = 0; e < 4; ++e) {
      const std::string name = "model.layers.0.mlp.experts." + std::to_string(e) + "." + kinds[which];
      INFO(name);
      CHECK((g.find(name) != nullptr) == (e >= 2));
    }
}

// The one rule for which parameters are experts (ZeRO shards them over their replica group).
TEST_CASE("thread ep: expert_of reads the expert index and nothing else", "[moe][ep]") {
  CHECK(expert_of("model.layers.0.block_sparse_moe.experts.3.w1.weight") == 3);
  CHECK(expert_of("model.layers.11.mlp.experts.127.down_proj.weight") == 127);
  CHECK(expert_of("model.layers.0.mlp.shared_expert.gate_proj.weight") == -1);
  CHECK(expert_of("model.layers.0.block_sparse_moe.gate.weight") == -1);
  CHECK(expert_of("model.layers.0.mlp.experts.gate_up_proj") == -1);  // transformers 5's fused tensor
  CHECK(expert_of("model.layers.0.mlp.experts..w1") == -1);
  CHECK(expert_of("model.layers.0.mlp.experts.7") == 7);
  CHECK(expert_of("") == -1);
}

}  // namespace autosp::test
