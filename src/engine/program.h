// The graph one rank runs: the model's forward graph, rewritten by the AutoSP pipeline for this
// rank of its SP group when the world has several ranks, then (for training) the backward graph.
// A bf16 run first gets the mixed-precision pass (f32 master weights, bf16 compute).
// Shared by autosp-train and autosp-graph so both show and run the same thing.
#include <memory>
#include <string>
#include <vector>

#pragma once

#include "graph/ir.h"
#include "graph/passes/pass.h"
#include "config/config.h"

namespace autosp {

enum class Stage { forward, autosp, joint };

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

// The model is built in master_dtype(dtype); for bf16 the mixed-precision pass runs first (at
// every stage, so autosp-graph shows what runs), then AutoSP, then autograd.
RankProgram build_program(const Config& cfg, DType dtype, Stage stage, const PassContext& ctx);

}  // namespace autosp
