// autosp-bench --mode compile: what building a rank's program costs as the model deepens. For each
// layer count (model.num_hidden_layers overridden), `iters` builds of the joint program
// (compiler/program.h build_program, every pass with the verifier after it) and a memory plan
// (engine/memory_plan.h) at the given sizes: the median of each pass's run and verify time. A
// compiler whose cost is linear in the graph shows each column doubling with the layers, no more.
// Knows nothing of kernels; nothing is run.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace autosp {

struct CompileBenchOptions {
  Config config;
  std::vector<int64_t> layers = {32, 64, 128};
  int world = 0;    // the rank's world (rank 0 of it); 0: sequence_parallel.autosp_size, one SP group
  int iters = 3;    // builds per layer count (the median is reported)
};

// The memory plan binds B = 1 and S = data.seq_len. One row per layer count: layers, world, nodes (of the joint graph), model_s (the forward graph),
// passes [{name, run_s, verify_s}] in pipeline order, plan_s (the memory plan), total_s, and
// vs_previous (total_s ÷ the previous row's) from the second row on.
void run_compile_bench(const CompileBenchOptions& opt, const std::function<void(const nlohmann::json&)>& emit);

}  // namespace autosp
