// What one rank holds at the peak of a step (training, or autosp-eval's forward), planned without
// running: the memory plan's arena (engine/memory_plan.h) plus what lives outside it (parameters,
// graph outputs, inputs and the optimizer state and gradient buckets of the run's ZeRO mode, by
// train/train_state.h planned_state_bytes; none for a forward-only program). autosp-graph and
// autosp-eval --plan-memory print it; autosp-plan's search compares it with the memory a device has. Knows nothing of kernels or communicators.
#pragma once

#include <cstddef>

#include <nlohmann/json.hpp>

#include "compiler/program.h"
#include "engine/memory_plan.h"

namespace autosp {

struct PlannedBytes {
  MemoryPlan plan;
  size_t params = 0, outputs = 0, inputs = 0, optimizer = 0, grad_buckets = 0;
  size_t frozen = 0;  // of params: LoRA's frozen base (no gradient, no optimizer state)
  size_t total() const { return plan.arena_bytes + params + outputs + inputs + optimizer + grad_buckets; }
};

// `prog` (a joint program, or any stage) at the sizes `b` for a rank of a world of `world` ranks,
// holding the state of ZeRO mode `mode` (prog.zero_mode; the graph of stages 0-2 is one, so a
// search plans it once for all three).
PlannedBytes planned_bytes(const RankProgram& prog, const Bindings& b, int world, DeviceKind device, ZeroMode mode);

// The same as autosp-graph --plan-memory's JSON: every figure, the bindings, and what is live at the
// peak, largest first.
nlohmann::json plan_summary(const RankProgram& prog, const Bindings& b, const Config& cfg, int world, DeviceKind device);

}  // namespace autosp
