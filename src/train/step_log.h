// What rank 0 reports of a run: the lines that open it (device, data, parameters, validation,
// dtype), then for each logged step (train.log_every, the first and last, and every validated one)
// the progress line (stderr; under --quiet only the run's train.log, apps/train.cpp) and the
// --metrics JSON object; every step, its curves (train/curves.h: TensorBoard, CSV). Other ranks report nothing: a StepLog made with lead = false is silent.
#pragma once

#include <chrono>
#include <fstream>
#include <string>

#include "config/config.h"
#include "train/curves.h"
#include "train/trainer.h"

namespace autosp {

// A step's throughput from its time: tokens/s over every micro-batch (input tokens, scored or not:
// a loss mask changes what counts in the loss, not the work; a skipped step did none: NaN), the job's model TFLOP/s
// (models/flops.h step_flops of the global batch, as autosp-bench reports it) and the MFU against
// the peak: runtime.peak_tflops, else the detected GPU's dense bf16 peak (device/cuda/device.h),
// times the ranks; none on a CPU without runtime.peak_tflops.
class StepThroughput {
 public:
  StepThroughput(const Config& cfg, int64_t dp, int world, Device dev);
  void fill(StepRecord& rec) const;  // from rec.step_ms; sets rec.tokens too
  double peak_tflops() const { return peak_; }  // the job's (0: unknown)

 private:
  double tokens_ = 0, flops_ = 0, peak_ = 0;  // per step
};

class StepLog {
 public:
  // Opens args.metrics for appending (a path that cannot be opened is a UsageError).
  StepLog(const TrainArgs& args, int64_t start, int64_t total, const Config& cfg, bool lead);

  // The run's opening lines.
  void run_start(Device dev, const Graph& program, const std::string& data, size_t num_params,
                 const std::string& validation_data) const;
  // Rank 0's lines for `rec` when it is a step to log; a failed metrics write is a RuntimeFailure.
  // Warns once, at the first or the last step, when under kFewTargets of the run's input tokens so
  // far were targets (loss masks or document masks that remove nearly everything), and once when
  // a validation's targets are under kFewTargets of its input tokens (its masks, named).
  void step(const StepRecord& rec);
  // Rank 0's closing lines: with runtime.profile_ops, where the steps' time went, per op kind.
  void run_end(const TrainResult& result) const;

  static constexpr double kFewTargets = 0.01;

 private:
  const Config& cfg_;
  bool lead_, quiet_;
  int64_t start_, total_;
  std::chrono::steady_clock::time_point began_;
  std::string metrics_path_;
  std::ofstream metrics_;
  Curves curves_;  // train.tensorboard_dir, train.csv_dir: every step, logged or not
  int64_t targets_ = 0, tokens_ = 0;  // over the run's steps so far
  bool warned_few_targets_ = false, warned_few_val_targets_ = false;
};

}  // namespace autosp
