// The graph one rank runs: the model's forward graph, then every pass of the program through one
// pipeline: mixed precision (bf16), the AutoSP passes for this rank of its SP group (worlds of
// several ranks), kernel fusion, autograd, activation checkpointing, canonicalize. Shared by
// autosp-train, autosp-bench and autosp-graph so all show and run the same thing.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "graph/ir.h"
#include "graph/passes/pass.h"
#include "config/config.h"
#include "comm/mesh.h"

namespace autosp {

// Where a program stops: after the forward (and mixed precision), after AutoSP, or the whole joint
// forward + backward.
enum class Stage { forward, autosp, rank_forward = autosp, joint };  // TEMP shim

// One pass of a rank's program and the stage it belongs to.
struct ProgramPass {
  Pass pass;
  Stage stage;
};

struct RankProgram {
  std::unique_ptr<Graph> graph;
  std::vector<std::string> param_names, grad_names;  // parallel lists (joint stage)
  std::string loss;  // the output holding the reported (global) loss
};

// P = sequence_parallel.autosp_size; rank r of its SP group as comm/mesh.h rank_layout places it
// (world_rank % P). A world size that P does not divide is rank_layout's UsageError.
PassContext pass_context(const Config& cfg, int world_size, int world_rank);

// The dtype of the parameters, their gradients, the optimizer state, checkpoints and --init-from
// weights for a run dtype: f32 master weights for a bf16 run, else the run dtype itself.
DType master_dtype(DType run);

// The passes of a rank's program, in order, each `PassResult run(Graph&, const PassContext&)`:
//   forward  mixed_precision (bf16 runs: before AutoSP, which shards whatever dtype flows, and
//            autograd, which differentiates the casts so f32 parameters get f32 gradients)
//   autosp   the AutoSP pipeline (graph/passes/autosp/autosp.h; worlds of more than one rank),
//            then shard_parameters (zero_optimization.stage 3 on such worlds:
//            graph/passes/shard_parameters.h)
//   joint    fuse_elementwise (runtime.fuse_kernels: after AutoSP, whose passes never see fused
//            ops, and before autograd, so the backward comes from the fused ops' vjps),
//            autograd, checkpoint_activations (runtime.activation_checkpointing),
//            regather_parameters (ZeRO-3: after every pass that places uses), canonicalize
std::vector<ProgramPass> program_passes(const Config& cfg, DType dtype, const PassContext& ctx);

// The model built in master_dtype(dtype), then every pass of program_passes up to `stage`, through
// one run_pipeline (the verifier after each pass; an error says "in pass X after [...]").
RankProgram build_program(const Config& cfg, DType dtype, Stage stage, const PassContext& ctx);
// The same, stopping after the named pass (its first occurrence) or stage ("forward", "autosp",
// "joint"); a name the program does not run is a UsageError listing those it does.
RankProgram build_program(const Config& cfg, DType dtype, std::string_view stop_after, const PassContext& ctx);

// TEMP shim until the compiler/ move lands.
template <class L>
  requires std::is_base_of_v<RankLayout, L>
RankProgram build_program(const Config& cfg, DType dtype, Stage stage, const L& l) {
  return build_program(cfg, dtype, stage, pass_context(cfg, l.world_size, l.world_rank));
}

}  // namespace autosp
