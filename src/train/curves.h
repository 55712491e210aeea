// Curves of a run as other tools read them, written by rank 0 every step (train/step_log.h calls
// it): TensorBoard event files under train.tensorboard_dir, and one CSV, <train.csv_dir>/metrics.csv
// (DeepSpeed's "tensorboard" and "csv_monitor" sections map onto the two keys, config/deepspeed.cpp).
//
// The event file is TensorBoard's format, written here (docs/decisions.md 118): a TFRecord stream
// (each record: u64 length, masked CRC-32C of the length, the bytes, masked CRC-32C of the bytes)
// of Event protobufs, encoded by hand: the first holds file_version "brain.Event:2", each later one
// a wall time, a step and a Summary of simple_value scalars under HF Trainer's tags (train/loss,
// train/learning_rate, train/grad_norm, train/tokens_per_sec, train/mfu, train/accuracy,
// eval/loss, eval/accuracy). Each step is flushed, so TensorBoard shows a live run.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"
#include "train/trainer.h"

namespace autosp {

// CRC-32C (Castagnoli) of `data`, and TFRecord's masking of it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

// One TensorBoard event file, events.out.tfevents.<time>.<host>.<pid>, in `dir` (created).
class EventFile {
 public:
  explicit EventFile(const std::string& dir);
  // One event at `step` holding these scalars; written and flushed.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

class Curves {
 public:
  // Nothing to write unless `lead` and a key is set. A directory that cannot be made or a file that
  // cannot be opened is a UsageError naming the key.
  Curves(const Config& cfg, bool lead);
  // The step's scalars (those it has: a skipped step no loss, a run without a peak no MFU).
  void step(const StepRecord& rec);

 private:
  std::unique_ptr<EventFile> events_;
  std::string csv_path_;
  std::ofstream csv_;
};

}  // namespace autosp
