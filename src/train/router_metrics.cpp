// RouterMetrics (train/router_metrics.h).
#include "train/router_metrics.h"

#include <algorithm>

#include "train/run_device.h"

namespace autosp {

RouterMetrics::RouterMetrics(const RankProgram& prog, const ModelConfig& m)
    : aux_name_(prog.aux_loss), stats_name_(prog.router_stats) {
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) layers_ += m.sparse_layer(l) ? 1 : 0;
}

void RouterMetrics::add(const RunResult& r) {
  if (!enabled()) return;
  aux_ += host_copy(r.outputs.at(aux_name_)).to_doubles()[0];  // the micro-batch's share of the mean
  const std::vector<double> stats = host_copy(r.outputs.at(stats_name_)).to_doubles();  // [L, 2, E]
  const size_t L = static_cast<size_t>(layers_), E = stats.size() / (2 * L);
  counts_.resize(L * E, 0.0);
  for (size_t l = 0; l < L; ++l)
    for (size_t e = 0; e < E; ++e) counts_[l * E + e] += stats[(2 * l) * E + e];
}

std::vector<std::pair<std::string, double>> RouterMetrics::finish() const {
  if (!enabled() || counts_.empty()) return {};
  const size_t L = static_cast<size_t>(layers_), E = counts_.size() / L;
  double worst = 0;
  for (size_t l = 0; l < L; ++l) {
    const auto row = counts_.begin() + static_cast<std::ptrdiff_t>(l * E);
    double sum = 0;
    for (size_t e = 0; e < E; ++e) sum += row[static_cast<std::ptrdiff_t>(e)];
    const double load = sum > 0 ? *std::max_element(row, row + static_cast<std::ptrdiff_t>(E)) * double(E) / sum : 0;
    worst = std::max(worst, load);
  }
  return {{"moe/aux_loss", aux_}, {"moe/expert_load", worst}};
}

}  // namespace autosp
