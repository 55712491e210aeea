// A mixture of experts' load-balancing metrics for the step line and --metrics (model
// .output_router_logits): the load-balancing loss as transformers reports it (aux_loss, before
// router_aux_loss_coef) and the expert load. Each micro-batch adds the program's outputs
// (RankProgram::aux_loss, router_stats: already reduced over the world by the graph), finish()
// returns the step's values. Knows nothing of the graph beyond those two outputs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "compiler/program.h"
#include "engine/executor.h"

namespace autosp {

class RouterMetrics {
 public:
  explicit RouterMetrics(const RankProgram& prog, const ModelConfig& m);
  bool enabled() const { return !aux_name_.empty(); }
  void add(const RunResult& r);
  // moe/aux_loss: the mean over the data-parallel groups and micro-batches of the load-balancing
  // loss; moe/expert_load: the worst MoE layer's max / mean tokens per expert over the step's
  // world batch (1 = perfectly balanced, E / k = every token to the same k experts).
  std::vector<std::pair<std::string, double>> finish() const;

 private:
  std::string aux_name_, stats_name_;
  int64_t layers_ = 0;  // the MoE layers (L)
  double aux_ = 0;
  std::vector<double> counts_;  // [L, E] the step's tokens per expert
};

}  // namespace autosp
