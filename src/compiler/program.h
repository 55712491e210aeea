// The program builder: the graph one rank runs. The model's forward graph, then every pass of the
// program through one pipeline: mixed precision (bf16), the AutoSP passes for this rank of its SP
// group (worlds of several ranks), ZeRO-3's parameter sharding, kernel fusion, autograd, activation
// checkpointing, canonicalize. Shared by autosp-train, autosp-bench and autosp-graph so all show and
// run the same thing. The passes' PassContext is built here and nowhere else: callers say where the
// rank sits (comm/mesh.h RankLayout) and the config says the rest. Knows nothing of kernels,
// devices, executors or training.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "graph/ir.h"
#include "graph/passes/pass.h"

namespace autosp {

// Where a program stops: after the forward (and mixed precision); after the forward this one rank
// runs (rank_forward: AutoSP and ZeRO-3's parameter sharding where they apply; on one rank the
// plain forward, which validation runs too); or the whole joint forward + backward.
enum class Stage { forward, rank_forward, joint };

struct RankProgram {
  std::unique_ptr<Graph> graph;
  std::vector<std::string> param_names, grad_names;  // parallel lists (joint stage): the trained parameters
  std::vector<std::string> frozen_names;  // parameters fed but not trained (LoRA's base: Role::frozen)
  std::string loss;  // the output holding the reported (global) loss
  // With a load-balancing loss (model.output_router_logits; models/moe.h): the outputs holding its
  // reported value (the raw loss, before router_aux_loss_coef; the world's mean) and the router
  // statistics [L, 2, E] (summed over the world); empty without.
  std::string aux_loss, router_stats;
  // The ZeRO mode the program was built for (decided once, from zero_optimization.stage and the
  // world size): the training state the trainer makes for it, and what --plan-memory counts.
  ZeroMode zero_mode = ZeroMode::replicated;
  // What building it cost (autosp-bench --mode compile): the model's forward graph, then each pass
  // with the verifier after it, in seconds.
  double model_s = 0;
  std::vector<PassTime> pass_times;
};

// train.objective "dpo": the pair slots a sequence holds at most (models/model.h
// GraphOptions::dpo_slots; a pair takes at least two tokens); 0 for "lm".
int64_t dpo_slots(const Config& cfg);

// The dtype of the parameters, their gradients, the optimizer state, checkpoints and --init-from
// weights for a run dtype: f32 master weights for a bf16 run, else the run dtype itself.
DType master_dtype(DType run);

// The passes of a rank's program (program.cpp: program_passes), in order, each
// `PassResult run(Graph&, const PassContext&)`:
//   forward  lora (a lora section: the adapters added, the base frozen, graph/passes/lora.h; first,
//            so every later pass sees plain matmuls and parameters), mixed_precision (bf16 runs: before AutoSP, which shards whatever dtype flows, and
//            autograd, which differentiates the casts so f32 parameters get f32 gradients)
//   rank_forward  the AutoSP pipeline (graph/passes/autosp/autosp.h; worlds of more than one
//            rank), expert_parallel (moe.expert_parallel_size > 1: graph/passes/expert_parallel.h),
//            then shard_parameters (ZeroMode::sharded_parameters, i.e. stage 3 on such
//            worlds: graph/passes/shard_parameters.h)
//   joint    feed_target_count (train.gradient_accumulation_steps > 1: the loss's denominator is fed,
//            graph/passes/feed_target_count.h), fuse_elementwise (runtime.fuse_kernels: after AutoSP, whose passes never see fused
//            ops, and before autograd, so the backward comes from the fused ops' vjps),
//            keep_moe_projections (a mixture of experts on the CPU with runtime.moe_keep_projections:
//            graph/passes/keep_moe_projections.h; before autograd, whose vjp hands the kept block on),
//            autograd, concat_slice_grads (runtime.fuse_kernels: a split tensor's gradient is
//            one concat, graph/passes/concat_slice_grads.h), checkpoint_activations
//            (runtime.activation_checkpointing),
//            regather_parameters (ZeRO-3: after every pass that places uses), canonicalize
// The list and the one PassContext every pass reads are made once per program from the config
// and the layout; the ZeRO mode (config/config.h zero_mode) is decided there, once.
//
// The model built in master_dtype(dtype), then every pass of the program up to `stage`, through
// one pipeline (verified after each pass, or in Release builds once after the last and after each
// only on a failure: graph/passes/pass.h run_pipeline_verified_once; an error says "in pass X after
// [...]"), for the
// rank `layout` places (comm/mesh.h: rank_layout(W, r, cfg.sequence_parallel.autosp_size), or the
// trainer's ProcessMesh; the default is a world of one rank). AutoSP shards for the layout's sp.
RankProgram build_program(const Config& cfg, DType dtype, Stage stage, const RankLayout& layout = {});
// The same, stopping after the named pass (its first occurrence) or stage ("forward",
// "rank_forward" or its older name "autosp", "joint"); a name the program does not run is a
// UsageError listing those it does.
RankProgram build_program(const Config& cfg, DType dtype, std::string_view stop_after, const RankLayout& layout = {});

}  // namespace autosp
