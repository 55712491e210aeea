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
#include "graph/passes/expert_parallel.h"

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
