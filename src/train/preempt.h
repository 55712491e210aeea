// Preemption: SIGTERM, SIGINT and SIGUSR1 (what SLURM and Kubernetes send before they kill a job,
// SLURM's --signal with a grace period) ask the run to stop after its current step. The trainer
// then agrees with every rank on the step (stop_agreed: a one-integer all-reduce per step), writes
// a checkpoint on rank 0, logs it and returns; autosp-train exits with kExitPreempted. A second
// signal ends the process at once (exit 128 + signal). If the run has not stopped within
// `save_timeout` seconds of the first signal it exits with 3 and an `error:` line: a scheduler's
// grace period is finite, and a save that hangs must not outlive it silently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm/communicator.h"

namespace autosp {

inline constexpr int kExitPreempted = 4;  // stopped by a signal after saving (docs/reliability.md)

class StopOnSignal {
 public:
  // Installs the handlers (restoring the previous ones on destruction) and a deadline thread.
  explicit StopOnSignal(double save_timeout_s);
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  // The signal this process received (0: none).
  static int received();
  // Whether any rank of `world` received one: every rank calls it once per step, in step order.
  bool stop_agreed(Communicator& world) const;

 private:
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread deadline_;
};

}  // namespace autosp
