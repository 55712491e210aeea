// Building a rank's program: model → mixed precision (bf16) → AutoSP pipeline → ZeRO-3's
// parameter sharding → kernel fusion → autograd → activation checkpointing → ZeRO-3's per-unit
// gathers → canonicalize, as one pipeline. The one place a PassContext is made (pass_context).
#include "compiler/program.h"

#include <algorithm>
#include <chrono>

#include "graph/autograd.h"
#include "graph/passes/autosp/autosp.h"
#include "graph/passes/checkpoint_activations.h"
#include "graph/passes/feed_target_count.h"
#include "graph/passes/concat_slice_grads.h"
#include "graph/passes/expert_parallel.h"
#include "graph/passes/keep_moe_projections.h"
#include "graph/passes/fuse_elementwise.h"
#include "graph/passes/lora.h"
#include "graph/passes/mixed_precision.h"
#include "graph/passes/shard_parameters.h"
#include "models/family.h"
#include "models/lora.h"
#include "models/model.h"
#include "tensor/check.h"

namespace autosp {

namespace {

// The lora section as the rewrite's plan: the weights its targets select, their adapters' names,
// the scale and the parameters modules_to_save keeps trainable (r = 0 without the section), and
// lora_dropout when the program trains (a forward-only program, validation or evaluation, is
// PEFT's model.eval(): no dropout).
LoraPlan lora_plan(const Config& cfg, bool training) {
  LoraPlan plan;
  if (!cfg.lora.enabled) return plan;
  plan.r = cfg.lora.r;
  plan.scale = cfg.lora.scale();
  plan.dropout = training ? cfg.lora.lora_dropout : 0.0;
  plan.seed = cfg.train.seed;
  for (const std::string& w : lora_target_weights(cfg.model, cfg.lora.target_modules))
    plan.targets.push_back({w, lora_a_name(w), lora_b_name(w)});
  plan.trainable = lora_saved_params(cfg.model, cfg.lora.modules_to_save);
  return plan;
}

// What every pass of the rank's program reads: where the rank sits, whether the ZeRO mode shards
// the parameters (the mode is decided once per program, by build_program; program_passes reads it
// from the context), and from the config the fusion and checkpointing settings.
PassContext pass_context(const Config& cfg, const RankLayout& layout, ZeroMode mode, bool training) {
  PassContext ctx;
  ctx.sp_size = layout.sp;
  ctx.sp_rank = layout.sp_rank;
  ctx.ring_size = layout.ring;
  ctx.world_size = layout.world_size;
  // Expert groups (moe.expert_parallel_size): E consecutive world ranks, as the mesh lays them out
  // (rank_layout checks E against the world size).
  ctx.ep_size = cfg.moe.expert_parallel_size;
  ctx.ep_rank = rank_layout(layout.world_size, layout.world_rank, layout.sp, layout.ring, ctx.ep_size).ep_rank;
  ctx.shard_parameters = mode == ZeroMode::sharded_parameters;
  // No residual + norm fusion under activation checkpointing (it would cost memory there:
  // passes/fuse_elementwise.h).
  ctx.fuse_residual_norms = !cfg.runtime.activation_checkpointing;
  ctx.fuse_qkv_heads = cfg.runtime.device == DeviceKind::cpu && !cfg.runtime.activation_checkpointing;
  ctx.fuse_residual_bias = cfg.runtime.device == DeviceKind::cpu;
  ctx.layer_scopes = layer_scopes(cfg.model);
  ctx.lora = lora_plan(cfg, training);
  ctx.accumulation_steps = cfg.train.gradient_accumulation_steps;
  ctx.keep_moe_projections = cfg.runtime.moe_keep_projections && cfg.runtime.device == DeviceKind::cpu;
  return ctx;
}

// One pass of a rank's program and the stage it belongs to.
struct ProgramPass {
  Pass pass;
  Stage stage;
};

// The passes of the program whose passes read `ctx` (program.h lists them).
std::vector<ProgramPass> program_passes(const Config& cfg, DType dtype, const PassContext& ctx) {
  std::vector<ProgramPass> out;
  if (ctx.lora.r > 0) out.push_back({{"lora", passes::lora, true}, Stage::forward});
  if (dtype == DType::bf16) out.push_back({{"mixed_precision", passes::mixed_precision, true}, Stage::forward});
  if (ctx.world_size > 1)
    for (const Pass& p : autosp_pipeline()) out.push_back({p, Stage::rank_forward});
  if (ctx.ep_size > 1) out.push_back({{"expert_parallel", passes::expert_parallel, true}, Stage::rank_forward});
  if (ctx.shard_parameters) out.push_back({{"shard_parameters", passes::shard_parameters, true}, Stage::rank_forward});
  if (cfg.train.gradient_accumulation_steps > 1 && cfg.train.objective == Objective::lm)  // DPO feeds its norms
    out.push_back({{"feed_target_count", passes::feed_target_count, true}, Stage::joint});
  if (cfg.runtime.fuse_kernels) out.push_back({{"fuse_elementwise", passes::fuse_elementwise, true}, Stage::joint});
  if (ctx.keep_moe_projections && family(cfg.model.arch).moe != Moe::none)
    out.push_back({{"keep_moe_projections", passes::keep_moe_projections, true}, Stage::joint});
  out.push_back({{"autograd", passes::autograd, true}, Stage::joint});
  if (cfg.runtime.fuse_kernels)
    out.push_back({{"concat_slice_grads", passes::concat_slice_grads, true}, Stage::joint});
  if (cfg.runtime.activation_checkpointing)
    out.push_back({{"checkpoint_activations", passes::checkpoint_activations, true}, Stage::joint});
  if (ctx.shard_parameters) out.push_back({{"regather_parameters", passes::regather_parameters, true}, Stage::joint});
  out.push_back({{"canonicalize", passes::canonicalize, true}, Stage::joint});
  return out;
}

RankProgram run_program(const Config& cfg, DType dtype, const std::vector<Pass>& passes, const PassContext& ctx,
                        ZeroMode mode, bool training) {
  RankProgram p;
  p.zero_mode = mode;
  auto make = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    auto g = build_forward(cfg.model, master_dtype(dtype), ForwardMode::train,
                           {.document_mask = cfg.data.document_mask || !cfg.data.pairs_path.empty(),
                            .tiled_mlp = cfg.runtime.tiled_mlp,
                            .tiled_loss = cfg.runtime.tiled_loss, .dpo_slots = dpo_slots(cfg),
                            .dpo = {.beta = cfg.dpo.beta, .loss_type = cfg.dpo.loss_type,
                                    .label_smoothing = cfg.dpo.label_smoothing, .rpo_alpha = cfg.dpo.rpo_alpha},
                            .router_aux_loss = training && cfg.model.output_router_logits});
    p.model_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return g;
  };
  // Release builds verify the program once, after its last pass (decision 188); Debug builds after
  // every pass, so that a pass's intermediate graph is checked as well.
#ifdef NDEBUG
  p.graph = run_pipeline_verified_once(make, passes, ctx, &p.pass_times);
#else
  p.graph = make();
  run_pipeline(*p.graph, passes, ctx, &p.pass_times);
#endif
  p.loss = p.graph->find("loss.global") ? "loss.global" : "loss";
  if (p.graph->find("aux_loss")) {  // the load-balancing loss (models/moe.h) and its statistics
    p.aux_loss = p.graph->find("aux_loss.global") ? "aux_loss.global" : "aux_loss";
    p.router_stats = p.graph->find("router_stats.global") ? "router_stats.global" : "router_stats";
  }
  for (Node* f : p.graph->with_role(Role::frozen)) p.frozen_names.push_back(f->name());
  // Gradients are the graph's Role::gradient outputs, in the order of the parameters (autograd).
  std::vector<Node*> grads;
  for (Node* o : p.graph->outputs())
    if (o->role() == Role::gradient) grads.push_back(o);
  if (!grads.empty()) {
    const std::vector<Node*> params = p.graph->with_role(Role::parameter);
    AUTOSP_ASSERT(params.size() == grads.size(), params.size(), " parameters but ", grads.size(), " gradients");
    for (size_t i = 0; i < params.size(); ++i) {
      p.param_names.push_back(params[i]->name());
      p.grad_names.push_back(grads[i]->name());
    }
  }
  return p;
}

std::string_view stage_name(Stage s) {
  switch (s) {
    case Stage::forward: return "forward";
    case Stage::rank_forward: return "rank_forward";
    case Stage::joint: return "joint";
  }
  return "";
}

}  // namespace

int64_t dpo_slots(const Config& cfg) {
  return cfg.train.objective == Objective::dpo ? std::max<int64_t>(1, cfg.data.seq_len / 2) : 0;
}

DType master_dtype(DType run) { return run == DType::bf16 ? DType::f32 : run; }

RankProgram build_program(const Config& cfg, DType dtype, Stage stage, const RankLayout& layout) {
  if (!cfg.auto_keys.empty())
    throw UsageError(str(*cfg.auto_keys.begin(), " is \"auto\": autosp-train and autosp-graph resolve it for the job's "
                         "world at start-up (autosp-plan shows the choice); give a value here"));
  const ZeroMode mode = zero_mode(cfg.zero_optimization, layout.world_size);
  const PassContext ctx = pass_context(cfg, layout, mode, stage == Stage::joint);
  std::vector<Pass> passes;
  for (const ProgramPass& p : program_passes(cfg, dtype, ctx))
    if (p.stage <= stage) passes.push_back(p.pass);
  return run_program(cfg, dtype, passes, ctx, mode, stage == Stage::joint);
}

RankProgram build_program(const Config& cfg, DType dtype, std::string_view stop_after, const RankLayout& layout) {
  if (stop_after == "autosp") return build_program(cfg, dtype, Stage::rank_forward, layout);  // the older name
  for (Stage s : {Stage::forward, Stage::rank_forward, Stage::joint})
    if (stop_after == stage_name(s)) return build_program(cfg, dtype, s, layout);
  const ZeroMode mode = zero_mode(cfg.zero_optimization, layout.world_size);
  const PassContext ctx = pass_context(cfg, layout, mode, true);
  std::vector<Pass> passes;
  std::string names;
  for (const ProgramPass& p : program_passes(cfg, dtype, ctx)) {
    passes.push_back(p.pass);
    if (p.pass.name == stop_after) return run_program(cfg, dtype, passes, ctx, mode, true);
    names += (names.empty() ? "" : ", ") + std::string(p.pass.name);
  }
  throw UsageError(str("--stage '", stop_after, "': expected forward, rank_forward (or autosp), joint or a pass ",
                       "this program runs (", names, ")"));
}

}  // namespace autosp
