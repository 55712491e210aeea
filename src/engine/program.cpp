// Building a rank's program: model → mixed precision (bf16) → AutoSP pipeline → kernel fusion → autograd.
#include "engine/program.h"

#include "comm/mesh.h"
#include "graph/autograd.h"
#include "graph/passes/autosp/autosp.h"
#include "graph/passes/checkpoint_activations.h"
#include "graph/passes/fuse_elementwise.h"
#include "graph/passes/mixed_precision.h"
#include "graph/verify.h"
#include "models/model.h"
#include "tensor/check.h"

namespace autosp {

PassContext pass_context(const Config& cfg, int world_size, int world_rank) {
  const RankLayout l = rank_layout(world_size, world_rank, static_cast<int>(cfg.sequence_parallel.autosp_size));
  PassContext ctx;
  ctx.sp_size = l.sp;
  ctx.sp_rank = l.sp_rank;
  ctx.world_size = l.world_size;
  return ctx;
}

DType master_dtype(DType run) { return run == DType::bf16 ? DType::f32 : run; }

RankProgram build_program(const Config& cfg, DType dtype, Stage stage, const PassContext& ctx) {
  RankProgram p;
  p.graph = build_forward(cfg.model, master_dtype(dtype));
  // Before AutoSP and autograd: AutoSP shards whatever dtype flows, and autograd differentiates
  // the casts, so the gradients reach the f32 parameters as f32 (docs/decisions.md).
  if (dtype == DType::bf16) apply_mixed_precision(*p.graph, ctx);
  p.loss = "loss";
  if (stage == Stage::forward) return p;
  if (ctx.world_size > 1) {
    apply_autosp(*p.graph, ctx);
    if (p.graph->find("loss.global")) p.loss = "loss.global";
  }
  if (stage == Stage::autosp) return p;
  // Fusion after AutoSP (whose passes then never see the fused ops) and before autograd (so the
  // backward comes from the fused ops' vjps); no residual + norm fusion under activation
  // checkpointing (it would cost memory there: passes/fuse_elementwise.cpp).
  if (cfg.runtime.fuse_kernels) {
    PassContext fuse_ctx = ctx;
    fuse_ctx.fuse_residual_norms = !cfg.runtime.activation_checkpointing;
    apply_fuse_elementwise(*p.graph, fuse_ctx);
  }
  std::vector<Node*> params = p.graph->with_role(Role::parameter);
  const size_t forward_end = p.graph->size();
  std::vector<Node*> grads = build_backward(*p.graph, p.graph->with_role(Role::loss).at(0), params);
  if (cfg.runtime.activation_checkpointing) checkpoint_activations(*p.graph, forward_end, layer_scopes(cfg.model));
  verify(*p.graph);
  for (size_t i = 0; i < params.size(); ++i) {
    p.param_names.push_back(params[i]->name());
    p.grad_names.push_back(grads[i]->name());
  }
  return p;
}

}  // namespace autosp
