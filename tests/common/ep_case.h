// Expert parallelism's equivalence check, shared by the thread-rank test
// (tests/comm/test_thread_ep.cpp) and the MPI one (tests/mpi/test_ep.cpp): a tiny Mixtral,
// Qwen2-MoE and Qwen3-MoE (4 experts, top 2), a rank's joint program on its dp rank's rows of the
// global batch with dense gradients summed over the world and its experts' over the "ep_replica"
// group (as the trainer sums them), and the comparison with the one-process run (sp_case.h's reference and
// tolerance): every dense gradient, exactly this rank's 1/G of the experts' (CHECK-based: call it
// on the thread that runs Catch). Also, through train() at any ZeRO stage (decision 185): a rank's
// config on the synthetic task, the one-process run, and the comparison of losses, norms and
// final whole weights.
#pragma once

#include <string>
#include <vector>

#include "common/sp_case.h"

namespace autosp::test {

inline const json kMixtral = {{"arch", "mixtral"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                       {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 24},
                       {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
inline const json kQwen2Moe = {{"arch", "qwen2_moe"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                        {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
                        {"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16},
                        {"shared_expert_intermediate_size", 24}, {"norm_topk_prob", false}};

// Qwen3-MoE: as Qwen3 (q/k norms) with norm_topk_prob and no shared expert.
inline const json kQwen3Moe = {{"arch", "qwen3_moe"}, {"vocab_size", 64}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                               {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 48},
                               {"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16},
                               {"norm_topk_prob", true}};

inline bool is_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }

struct EpLayout {
  int world;
  int64_t sp, ring, ep;
  bool checkpointing = false;
};

// The joint program of rank w.rank() with its mesh, on its dp rank's rows of `global`.
inline LossAndGrads run_ep_rank(Communicator& w, const json& model, const EpLayout& l, const Batch& global,
                         const ParamMap& params, DType dt = DType::f32) {
  const int64_t dp = l.world / l.sp, rows_each = global.input_ids.dim(0) / dp, S = global.input_ids.dim(1);
  Config cfg = make_config(model, l.sp, {{"seq_len", S}, {"batch_size", rows_each}});
  cfg.sequence_parallel.ring_size = l.ring;
  cfg.moe.expert_parallel_size = l.ep;
  cfg.runtime.activation_checkpointing = l.checkpointing;
  ProcessMesh mesh = make_mesh(w, l.sp, l.ring, l.ep);
  const int64_t d = mesh.dp_rank;
  auto rows = [&](const Tensor& t) { return t.as_strided({rows_each, S}, t.strides(), d * rows_each * S).contiguous(); };
  const Batch mine{rows(global.input_ids), rows(global.labels), rows(global.position_ids)};
  RankProgram prog = build_program(cfg, dt, Stage::joint, mesh);
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

// One rank's loss and gradients against `ref`: the dense ones all there, the experts' exactly
// this rank's 1/G (experts [g·L, (g+1)·L) of each layer, g = rank % G, 4 experts in 2 layers),
// each within kTol.
inline void check_ep_rank(const LossAndGrads& got, int rank, const EpLayout& l, const LossAndGrads& ref) {
  const int64_t E = 4, L = E / l.ep;
  INFO("rank " << rank);
  CHECK(std::abs(got.loss - ref.loss) / std::abs(ref.loss) < kTol);
  size_t experts = 0;
  for (const auto& [name, want] : ref.grads) {
    INFO("gradient of " << name);
    auto it = got.grads.find(name);
    if (is_expert(name)) {  // "...experts.<e>.": held here exactly when e is one of this rank's
      const size_t at = name.find(".experts.") + 9;
      const int64_t e = std::stoll(name.substr(at, name.find('.', at) - at));
      CHECK((it != got.grads.end()) == (e / L == rank % l.ep));
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

// One model's case: its weights, the global batch, and the one-process run on it.
struct EpCase {
  ParamMap params;
  Batch global;
  LossAndGrads ref;
};
inline EpCase ep_case(const json& model) {
  const Config cfg1 = make_config(model, 1, {{"seq_len", 16}, {"batch_size", 2}});
  EpCase c{init_params(cfg1.model, 17, DType::f32), random_batch(2, 16, cfg1.model.vocab_size, 9), {}};
  c.ref = run_reference(cfg1, c.global, c.params);
  return c;
}

// The layouts both tests run: Ulysses, Ulysses × ring, dp × sp, activation checkpointing.
inline const std::vector<EpLayout>& ep_layouts() {
  static const std::vector<EpLayout> l{{2, 2, 1, 2}, {4, 4, 1, 2}, {4, 4, 1, 4}, {4, 4, 2, 4},
                                       {4, 2, 1, 4}, {4, 2, 1, 2}, {4, 4, 1, 4, true}};
  return l;
}

inline std::string describe(const EpLayout& l) {
  return "world " + std::to_string(l.world) + ", sp " + std::to_string(l.sp) + ", ring " + std::to_string(l.ring) +
         ", ep " + std::to_string(l.ep) + (l.checkpointing ? ", activation checkpointing" : "");
}

// A rank's train() config under `l` at ZeRO `stage` on the synthetic task: the one-process run's
// 2 rows per step in all (2 / dp per dp rank), a bucket small enough for several per group.
inline const json kEpTrainOpt = {{"steps", 3}, {"lr", 1e-2}, {"warmup_steps", 1}, {"min_lr", 1e-4}, {"grad_clip", 0.5}};
inline Config ep_train_config(const json& model, const EpLayout& l, int64_t stage, const json& opt = kEpTrainOpt) {
  const int64_t dp = l.world / l.sp;
  Config cfg = make_config(model, l.sp, {{"source", "synthetic"}, {"seq_len", 16}, {"batch_size", 2 / dp}}, opt);
  cfg.sequence_parallel.ring_size = l.ring;
  cfg.moe.expert_parallel_size = l.ep;
  cfg.zero_optimization.stage = stage;
  cfg.runtime.activation_checkpointing = l.checkpointing;
  cfg.runtime.grad_bucket_mb = 0.01;
  return cfg;
}
inline TrainArgs quiet_args() {
  TrainArgs a;
  a.quiet = true;
  return a;
}
// The one-process run (E = 1, ZeRO 0) of the same steps.
inline TrainResult train_one_process(const json& model, const json& opt = kEpTrainOpt) {
  auto single = make_single_process_communicator();
  return train(ep_train_config(model, {1, 1, 1, 1}, 0, opt), quiet_args(), *single);
}
// A rank's run against the one-process one: every step's loss (kTol) and gradient norm (1e-4), and
// every final whole weight within 1e-3 (AdamW's first steps move an element by about lr whatever
// its gradient's size, so a gradient element near zero turns float noise, the sums' order under
// SP, into weight).
inline void check_train_like(const TrainResult& got, const TrainResult& ref) {
  REQUIRE(got.steps.size() == ref.steps.size());
  for (size_t k = 0; k < ref.steps.size(); ++k) {
    INFO("step " << k + 1);
    CHECK(std::abs(got.steps[k].loss - ref.steps[k].loss) < kTol * std::abs(ref.steps[k].loss));
    CHECK(std::abs(got.steps[k].grad_norm - ref.steps[k].grad_norm) < 1e-4 * ref.steps[k].grad_norm);
  }
  CHECK(got.params.size() == ref.params.size());
  for (const auto& [name, want] : ref.params) {
    INFO(name);
    auto it = got.params.find(name);
    CHECK(it != got.params.end());
    if (it != got.params.end()) CHECK(rel_err(it->second, want) < 1e-3);
  }
}

}  // namespace autosp::test
