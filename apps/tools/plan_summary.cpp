// A rank's planned bytes for a step (see the header).
#include "tools/plan_summary.h"

#include <algorithm>

#include "graph/passes/expert_parallel.h"  // expert_of
#include "tensor/check.h"
#include "train/train_state.h"

namespace autosp {

PlannedBytes planned_bytes(const RankProgram& prog, const Bindings& b, int world, DeviceKind device, ZeroMode mode) {
  const Graph& g = *prog.graph;
  PlannedBytes p;
  p.plan = plan_memory(g, b, device);
  // Under expert parallelism (moe_experts_ep, group_size E) the experts' gradients and state belong
  // to the world / E ranks holding them, the dense ones' to the world (decision 185).
  int64_t ep = 1;
  for (const auto& n : g.nodes())
    if (n->op() == Op::moe_experts_ep) ep = n->attrs().i("group_size");
  auto expert = [&](const std::string& name) { return ep > 1 && expert_of(name) >= 0; };
  auto bytes_of = [&](const Node& n) {
    size_t bytes = dtype_size(n.dtype());
    for (const auto& d : n.shape()) bytes *= static_cast<size_t>(d.eval(b));
    return bytes;
  };
  size_t trained[2] = {0, 0}, grads[2] = {0, 0};  // [dense, experts]
  for (const auto& n : g.nodes()) {
    const size_t bytes = bytes_of(*n);
    if (n->op() == Op::parameter) p.params += bytes;
    else if (n->op() == Op::input) p.inputs += bytes;
    if (n->role() == Role::frozen) p.frozen += bytes;
    if (n->op() == Op::parameter && n->role() != Role::frozen) trained[expert(n->name())] += bytes;
    if (g.is_output(n.get())) p.outputs += bytes;
  }
  for (size_t i = 0; i < prog.grad_names.size(); ++i)
    grads[expert(prog.param_names[i])] += bytes_of(*g.find(prog.grad_names[i]));
  PlannedStateBytes state = planned_state_bytes(mode, trained[0], grads[0], world);
  const PlannedStateBytes experts = planned_state_bytes(mode, trained[1], grads[1], static_cast<int>(world / ep));
  state.optimizer += experts.optimizer;
  state.grad_buckets += experts.grad_buckets;
  state.freed_outputs += experts.freed_outputs;
  p.outputs -= state.freed_outputs;
  p.optimizer = state.optimizer;
  p.grad_buckets = state.grad_buckets;
  return p;
}

nlohmann::json plan_summary(const RankProgram& prog, const Bindings& b, const Config& cfg, int world, DeviceKind device) {
  const Graph& g = *prog.graph;
  const PlannedBytes p = planned_bytes(prog, b, world, device, prog.zero_mode);
  const MemoryPlan& plan = p.plan;
  nlohmann::json j = {{"arena_bytes", plan.arena_bytes}, {"max_live_bytes", plan.max_live_bytes},
                      {"parameter_bytes", p.params},     {"frozen_parameter_bytes", p.frozen},
                      {"output_bytes", p.outputs},
                      {"input_bytes", p.inputs},         {"optimizer_bytes", p.optimizer},
                      {"grad_bucket_bytes", p.grad_buckets}, {"zero_stage", cfg.zero_optimization.stage},
                      {"zero_mode", zero_mode_name(prog.zero_mode)}, {"total_bytes", p.total()}};
  for (const auto& [k, v] : b) j["bindings"][k] = v;
  // What is live where the intermediates peak, largest first: the first place to look for memory.
  std::vector<MemoryPlan::LiveBuffer> live = plan.live_at_peak;
  std::stable_sort(live.begin(), live.end(), [](const auto& x, const auto& y) { return x.bytes > y.bytes; });
  nlohmann::json at_peak = nlohmann::json::array();
  for (const auto& l : live) {
    const Node& n = *g.nodes()[l.position];
    const std::string name = l.output == 0 ? n.name() : l.output < 0 ? str(n.name(), "#workspace") : str(n.name(), "#", l.output);
    at_peak.push_back({{"node", name}, {"op", n.op_name()}, {"bytes", l.bytes}});
  }
  if (!g.nodes().empty())
    j["peak"] = {{"at", g.nodes()[plan.peak_position]->name()}, {"live", std::move(at_peak)}};
  return j;
}

}  // namespace autosp
