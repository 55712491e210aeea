// What rank 0 reports of a run: the lines that open it (device, data, parameters, validation,
// dtype), then for each logged step (train.log_every, the first and last, and every validated one)
// the progress line (stderr; under --quiet only the run's train.log, apps/train.cpp) and the
// --metrics JSON object. Other ranks report nothing: a StepLog made with lead = false is silent.
#pragma once

#include <chrono>
#include <fstream>
#include <string>

#include "config/config.h"
#include "train/trainer.h"

namespace autosp {

class StepLog {
 public:
  // Opens args.metrics for appending (a path that cannot be opened is a UsageError).
  StepLog(const TrainArgs& args, int64_t start, int64_t total, const Config& cfg, bool lead);

  // The run's opening lines.
  void run_start(Device dev, const std::string& data, size_t num_params, const std::string& validation_data) const;
  // Rank 0's lines for `rec` when it is a step to log; a failed metrics write is a RuntimeFailure.
  void step(const StepRecord& rec);

 private:
  const Config& cfg_;
  bool lead_, quiet_;
  int64_t start_, total_;
  std::chrono::steady_clock::time_point began_;
  std::string metrics_path_;
  std::ofstream metrics_;
};

}  // namespace autosp
