// Expert parallelism (moe.expert_parallel_size G; graph/passes/expert_parallel.h,
// engine/expert_parallel.h) with ranks as threads: each rank holds 1/G of every MoE layer's
// experts, and the loss and every gradient equal the unsharded one-process run on the same global
// batch (tests/common/sp_case.h's reference and tolerance) for Mixtral and Qwen2-MoE (shared
// expert), with G = 2 and 4 under Ulysses SP, Ulysses × ring, dp × sp and activation
// checkpointing. Dense gradients are summed over the world, a local expert's over the ranks that
// hold the same experts (the "ep_replica" group), as the trainer does.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "comm/threads.h"
#include "common/sp_case.h"

namespace autosp::test {
namespace {

const json kMixtral = {{"arch", "mixtral"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                       {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 24},
                       {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
const json kQwen2Moe = {{"arch", "qwen2_moe"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                        {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
                        {"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16},
                        {"shared_expert_intermediate_size", 24}, {"norm_topk_prob", false}};

bool is_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }

struct Layout {
  int world;
  int64_t sp, ring, ep;
  bool checkpointing = false;
};

// The joint program of this thread rank with its mesh, on its dp rank's rows of `global`.
LossAndGrads run_ep_rank(ThreadCommunicator& w, const json& model, const Layout& l, const Batch& global,
                         const ParamMap& params) {
  const int64_t dp = l.world / l.sp, rows_each = global.input_ids.dim(0) / dp, S = global.input_ids.dim(1);
  Config cfg = make_config(model, l.sp, {{"seq_len", S}, {"batch_size", rows_each}});
  cfg.sequence_parallel.ring_size = l.ring;
  cfg.moe.expert_parallel_size = l.ep;
  cfg.runtime.activation_checkpointing = l.checkpointing;
  ProcessMesh mesh = make_mesh(w, l.sp, l.ring, l.ep);
  const int64_t d = mesh.dp_rank;
  auto rows = [&](const Tensor& t) { return t.as_strided({rows_each, S}, t.strides(), d * rows_each * S).contiguous(); };
  const Batch mine{rows(global.input_ids), rows(global.labels), rows(global.position_ids)};
  RankProgram prog = build_program(cfg, DType::f32, Stage::joint, mesh);
  Executor ex(*prog.graph);
  TensorMap feeds = batch_feeds(mine);
  for (const std::string& name : prog.param_names) feeds[name] = params.at(name);
  RunResult r = ex.run(feeds, mesh.groups(w));
  std::vector<Tensor> dense, experts;
  std::vector<std::string> dense_names, expert_names;
  for (size_t i = 0; i < prog.param_names.size(); ++i) {
    const bool e = is_expert(prog.param_names[i]);
    (e ? experts : dense).push_back(r.outputs.at(prog.grad_names[i]));
    (e ? expert_names : dense_names).push_back(prog.param_names[i]);
  }
  all_reduce_bucketed(w, dense);
  if (l.ep > 1) all_reduce_bucketed(*mesh.ep_replica_group, experts);
  else all_reduce_bucketed(w, experts);
  LossAndGrads out;
  out.loss = r.outputs.at(prog.loss).to_doubles().at(0);
  for (size_t i = 0; i < dense.size(); ++i) out.grads[dense_names[i]] = dense[i];
  for (size_t i = 0; i < experts.size(); ++i) out.grads[expert_names[i]] = experts[i];
  return out;
}

// Every rank's loss and gradients against `ref`: the dense ones all there, the experts' exactly
// this rank's 1/G (experts [g·L, (g+1)·L) of each layer, g = rank % G), each within kTol.
void check_layout(const json& model, const Layout& l, const Batch& global, const ParamMap& params,
                  const LossAndGrads& ref) {
  std::vector<LossAndGrads> out(static_cast<size_t>(l.world));
  run_thread_ranks(l.world, [&](ThreadCommunicator& w) {
    out[static_cast<size_t>(w.rank())] = run_ep_rank(w, model, l, global, params);
  });
  const int64_t E = 4, L = E / l.ep;
  for (int r = 0; r < l.world; ++r) {
    INFO("rank " << r);
    const LossAndGrads& got = out[static_cast<size_t>(r)];
    CHECK(std::abs(got.loss - ref.loss) / std::abs(ref.loss) < kTol);
    size_t experts = 0;
    for (const auto& [name, want] : ref.grads) {
      INFO("gradient of " << name);
      auto it = got.grads.find(name);
      if (is_expert(name)) {  // "...experts.<e>.": held here exactly when e is one of this rank's
        const size_t at = name.find(".experts.") + 9;
        const int64_t e = std::stoll(name.substr(at, name.find('.', at) - at));
        const bool local = e / L == r % l.ep;
        CHECK((it != got.grads.end()) == local);
        if (it == got.grads.end()) continue;
        ++experts;
      }
      CHECK(it != got.grads.end());
      if (it == got.grads.end()) continue;
      CHECK(rel_err(it->second, want) < kTol);
    }
    CHECK(experts == size_t(2 * 3 * L));  // 2 layers × (gate, up, down) × L
    CHECK(got.grads.size() == ref.grads.size() - size_t(2 * 3 * (E - L)));
  }
}

}  // namespace

TEST_CASE("thread ep: G = 2 and 4 equal one process for Mixtral and Qwen2-MoE under Ulysses, ring and dp x sp",
          "[threads][moe][ep]") {
  for (const json& model : {kMixtral, kQwen2Moe}) {
    const Config cfg1 = make_config(model, 1, {{"seq_len", 16}, {"batch_size", 2}});
    const ParamMap params = init_params(cfg1.model, 17, DType::f32);
    const Batch global = random_batch(2, 16, cfg1.model.vocab_size, 9);
    const LossAndGrads ref = run_reference(cfg1, global, params);
    for (const Layout& l : {Layout{2, 2, 1, 2}, Layout{4, 4, 1, 2}, Layout{4, 4, 1, 4}, Layout{4, 4, 2, 4},
                            Layout{4, 2, 1, 4}, Layout{4, 2, 1, 2}, Layout{4, 4, 1, 4, true}}) {
      INFO(model_name(model) << ": world " << l.world << ", sp " << l.sp << ", ring " << l.ring << ", ep " << l.ep
                             << (l.checkpointing ? ", activation checkpointing" : ""));
      check_layout(model, l, global, params, ref);
    }
  }
}

// Through train() (train/train_state.cpp ExpertParallelState): the loss and gradient norm of every
// step and the final whole parameters (each expert broadcast from its owner) equal the one-process
// run's, so the expert-replica all-reduce, the norm over the expert group and the AdamW update of
// the local experts are those of one process.
TEST_CASE("thread ep: train() with G = 2 and 4 gives the one-process losses, norms and final weights",
          "[threads][moe][ep]") {
  const json data = {{"source", "synthetic"}, {"seq_len", 16}, {"batch_size", 2}};
  const json opt = {{"steps", 4}, {"lr", 1e-2}, {"warmup_steps", 1}, {"min_lr", 1e-4}, {"grad_clip", 0.5}};
  TrainArgs args;
  args.quiet = true;
  auto single = make_single_process_communicator();
  const TrainResult ref = train(make_config(kQwen2Moe, 1, data, opt), args, *single);
  REQUIRE(ref.steps.size() == 4);
  for (const int P : {2, 4}) {
    std::vector<TrainResult> got(static_cast<size_t>(P));
    run_thread_ranks(P, [&](ThreadCommunicator& w) {
      Config cfg = make_config(kQwen2Moe, P, data, opt);
      cfg.moe.expert_parallel_size = P;
      got[static_cast<size_t>(w.rank())] = train(cfg, args, w);
    });
    for (const auto& rank : got) {
      INFO("P = G = " << P);
      REQUIRE(rank.steps.size() == 4);
      for (size_t k = 0; k < ref.steps.size(); ++k) {
        INFO("step " << k + 1);
        CHECK(std::abs(rank.steps[k].loss - ref.steps[k].loss) < kTol * std::abs(ref.steps[k].loss));
        CHECK(std::abs(rank.steps[k].grad_norm - ref.steps[k].grad_norm) < 1e-4 * ref.steps[k].grad_norm);
      }
      CHECK(rank.params.size() == ref.params.size());
      for (const auto& [name, want] : ref.params) {
        INFO(name);
        auto it = rank.params.find(name);
        CHECK(it != rank.params.end());
        // 1e-3: AdamW's early steps move an element by about lr whatever its gradient's size, so
        // a gradient element near zero turns float noise (the sums' order under SP) into weight.
        if (it != rank.params.end()) CHECK(rel_err(it->second, want) < 1e-3);
      }
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

}  // namespace autosp::test
