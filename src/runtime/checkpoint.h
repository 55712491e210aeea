// Checkpoints: <root>/step_<NNNNNNNN>/ holding model.safetensors (Hugging Face names),
// optimizer.safetensors (exp_avg.<name>, exp_avg_sq.<name>) and meta.json (format, step, the
// resolved config, data position). A checkpoint directory is written under a temporary name,
// fsynced and renamed into place, so a crash mid-write never leaves a partial checkpoint where a
// good one was. Loading validates everything against the run's config: a mismatch is a UsageError.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "models/config.h"
#include "runtime/optimizer.h"

namespace autosp {

struct Checkpoint {
  int64_t step = 0;  // number of completed steps
  ParamMap params;
  AdamW optimizer;
  nlohmann::json meta;
};

// Returns the checkpoint's directory.
std::string save_checkpoint(const std::string& root, int64_t step, const ParamMap& params, const AdamW& opt,
                            const nlohmann::json& resolved_config);

// `path` is a checkpoint directory (it has meta.json) or a root holding step_* directories (the
// newest complete one is used).
Checkpoint load_checkpoint(const std::string& path, const Config& cfg, DType dtype);

}  // namespace autosp
