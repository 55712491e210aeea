// Building a rank's program: model → mixed precision (bf16) → AutoSP pipeline → ZeRO-3's
// parameter sharding → kernel fusion → autograd → activation checkpointing → ZeRO-3's per-unit
// gathers → canonicalize, as one pipeline.
#include "engine/program.h"

#include "comm/mesh.h"
#include "graph/autograd.h"
#include "graph/passes/autosp/autosp.h"
#include "graph/passes/checkpoint_activations.h"
#include "graph/passes/fuse_elementwise.h"
#include "graph/passes/mixed_precision.h"
#include "graph/passes/shard_parameters.h"
#include "models/model.h"
#include "tensor/check.h"

namespace autosp {

PassContext pass_context(const Config& cfg, int world_size, int world_rank) {
  const RankLayout l = rank_layout(world_size, world_rank, static_cast<int>(cfg.sequence_parallel.autosp_size));
  PassContext ctx;
  ctx.sp_size = l.sp;
  ctx.sp_rank = l.sp_rank;
  ctx.world_size = l.world_size;
  ctx.zero_stage = cfg.zero_optimization.stage;
  return ctx;
}

DType master_dtype(DType run) { return run == DType::bf16 ? DType::f32 : run; }


std::vector<ProgramPass> program_passes(const Config& cfg, DType dtype, const PassContext& ctx) {
  std::vector<ProgramPass> out;
  if (dtype == DType::bf16) out.push_back({{"mixed_precision", passes::mixed_precision, true}, Stage::forward});
  if (ctx.world_size > 1)
    for (const Pass& p : autosp_pipeline()) out.push_back({p, Stage::autosp});
  const bool zero3 = ctx.zero_stage == 3 && ctx.world_size > 1;
  if (zero3) out.push_back({{"shard_parameters", passes::shard_parameters, true}, Stage::autosp});
  if (cfg.runtime.fuse_kernels) out.push_back({{"fuse_elementwise", passes::fuse_elementwise, true}, Stage::joint});
  out.push_back({{"autograd", passes::autograd, true}, Stage::joint});
  if (cfg.runtime.activation_checkpointing)
    out.push_back({{"checkpoint_activations", passes::checkpoint_activations, true}, Stage::joint});
  if (zero3) out.push_back({{"regather_parameters", passes::regather_parameters, true}, Stage::joint});
  out.push_back({{"canonicalize", passes::canonicalize, true}, Stage::joint});
  return out;
}

namespace {

PassContext program_context(const Config& cfg, const PassContext& ctx) {
  PassContext full = ctx;
  // No residual + norm fusion under activation checkpointing (it would cost memory there:
  // passes/fuse_elementwise.h).
  full.fuse_residual_norms = !cfg.runtime.activation_checkpointing;
  full.layer_scopes = layer_scopes(cfg.model);
  return full;
}

RankProgram run_program(const Config& cfg, DType dtype, const std::vector<Pass>& passes, const PassContext& ctx) {
  RankProgram p;
  p.graph = build_forward(cfg.model, master_dtype(dtype), ForwardMode::train,
                          {.document_mask = cfg.data.document_mask, .tiled_mlp = cfg.runtime.tiled_mlp,
                           .tiled_loss = cfg.runtime.tiled_loss});
  run_pipeline(*p.graph, passes, program_context(cfg, ctx));
  p.loss = p.graph->find("loss.global") ? "loss.global" : "loss";
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
    case Stage::autosp: return "autosp";
    case Stage::joint: return "joint";
  }
  return "";
}

}  // namespace

RankProgram build_program(const Config& cfg, DType dtype, Stage stage, const PassContext& ctx) {
  std::vector<Pass> passes;
  for (const ProgramPass& p : program_passes(cfg, dtype, ctx))
    if (p.stage <= stage) passes.push_back(p.pass);
  return run_program(cfg, dtype, passes, ctx);
}

RankProgram build_program(const Config& cfg, DType dtype, std::string_view stop_after, const PassContext& ctx) {
  for (Stage s : {Stage::forward, Stage::autosp, Stage::joint})
    if (stop_after == stage_name(s)) return build_program(cfg, dtype, s, ctx);
  const std::vector<ProgramPass> all = program_passes(cfg, dtype, ctx);
  std::vector<Pass> passes;
  std::string names;
  for (const ProgramPass& p : all) {
    passes.push_back(p.pass);
    if (p.pass.name == stop_after) return run_program(cfg, dtype, passes, ctx);
    names += (names.empty() ? "" : ", ") + std::string(p.pass.name);
  }
  throw UsageError(str("--stage '", stop_after, "': expected forward, autosp, joint or a pass this program runs (",
                       names, ")"));
}

}  // namespace autosp
