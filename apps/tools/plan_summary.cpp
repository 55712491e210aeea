// The memory plan as JSON (tools/plan_summary.h).
#include "tools/plan_summary.h"

#include <algorithm>

#include "train/train_state.h"

namespace autosp {

// Planned bytes of one rank's step: the arena of intermediates, plus what lives outside it —
// parameters, graph outputs, inputs and, for training, the optimizer state and gradient buckets of
// the run's ZeRO mode (train/train_state.h planned_state_bytes: the same rules the training state
// follows).
nlohmann::json plan_summary(const RankProgram& prog, const Bindings& b, const Config& cfg, int world, DeviceKind device) {
  const Graph& g = *prog.graph;
  MemoryPlan plan = plan_memory(g, b, device);
  size_t params = 0, outputs = 0, inputs = 0, grads = 0;
  for (const auto& n : g.nodes()) {
    size_t bytes = dtype_size(n->dtype());
    for (const auto& d : n->shape()) bytes *= static_cast<size_t>(d.eval(b));
    if (n->op() == Op::parameter) params += bytes;
    else if (n->op() == Op::input) inputs += bytes;
    if (g.is_output(n.get())) outputs += bytes;
    if (g.is_output(n.get()) && n->role() == Role::gradient) grads += bytes;
  }
  const ZeroMode mode = prog.zero_mode;
  const PlannedStateBytes state = planned_state_bytes(mode, params, grads, world);
  outputs -= state.freed_outputs;
  const size_t optimizer = state.optimizer, buckets = state.grad_buckets;
  nlohmann::json j = {{"arena_bytes", plan.arena_bytes}, {"max_live_bytes", plan.max_live_bytes},
                      {"parameter_bytes", params},      {"output_bytes", outputs},
                      {"input_bytes", inputs},          {"optimizer_bytes", optimizer},
                      {"grad_bucket_bytes", buckets},   {"zero_stage", cfg.zero_optimization.stage},
                      {"zero_mode", zero_mode_name(mode)},
                      {"total_bytes", plan.arena_bytes + params + outputs + inputs + optimizer + buckets}};
  for (const auto& [k, v] : b) j["bindings"][k] = v;
  // What is live where the intermediates peak, largest first: the first place to look for memory.
  std::vector<MemoryPlan::LiveBuffer> live = plan.live_at_peak;
  std::stable_sort(live.begin(), live.end(), [](const auto& x, const auto& y) { return x.bytes > y.bytes; });
  nlohmann::json at_peak = nlohmann::json::array();
  for (const auto& l : live) {
    const Node& n = *g.nodes()[l.position];
    const std::string name = l.output == 0 ? n.name() : l.output < 0 ? str(n.name(), "#workspace") : str(n.name(), "#", l.output);
    at_peak.push_back({{"node", name}, {"op", n.op_name()},
                       {"bytes", l.bytes}});
  }
  if (!g.nodes().empty())
    j["peak"] = {{"at", g.nodes()[plan.peak_position]->name()}, {"live", std::move(at_peak)}};
  return j;
}

}  // namespace autosp
