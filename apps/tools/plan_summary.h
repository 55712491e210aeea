// The memory plan of a rank's program as JSON, shared by autosp-graph --plan-memory and
// autosp-eval --plan-memory: the arena of intermediates, plus what lives outside it (parameters,
// graph outputs, inputs and, for training, the optimizer state and gradient buckets of the run's
// ZeRO mode: train/train_state.h planned_state_bytes) and what is live at the peak.
#pragma once

#include <nlohmann/json.hpp>

#include "compiler/program.h"
#include "engine/memory_plan.h"

namespace autosp {

// {"arena_bytes", "max_live_bytes", "parameter_bytes", "output_bytes", "input_bytes",
//  "optimizer_bytes", "grad_bucket_bytes", "zero_stage", "zero_mode", "total_bytes", "bindings",
//  "peak": {"at", "live": [{"node", "op", "bytes"}]}} for `prog` at the sizes `b`, one of `world` ranks.
nlohmann::json plan_summary(const RankProgram& prog, const Bindings& b, const Config& cfg, int world, DeviceKind device);

}  // namespace autosp
