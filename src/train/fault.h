// What keeps a multi-rank job from hanging, and the fault injection that tests it.
//
// Watchdog: a thread that ends the whole job when this rank has waited in one collective for
// longer than AUTOSP_COLLECTIVE_TIMEOUT seconds (default 600): a rank that died or hung leaves the
// others blocked in their next collective, and MPI alone would wait forever. GuardedCommunicator
// wraps a Communicator so that every collective runs under the watchdog; time spent computing or
// writing checkpoints is never counted.
//
// Fault injection (tests only): AUTOSP_FAULT="rank:R,step:K,kind:KIND[,where:WHERE]" makes rank R
// fail in step K (1-based, the number the progress line shows):
//   kind  exit   print an `error:` line and exit(3) (the MPI exit hook aborts the job)
//         abort  Communicator::abort with exit code 3
//         crash  die of SIGSEGV (default handler, no core file): no cleanup at all
//         hang   block forever outside any collective (the other ranks' watchdogs end the job)
//         nan    this rank's gradients become NaN before the all-reduce (every rank then stops on
//                the non-finite loss check, exit 3, before the update or a checkpoint)
//   where step        at the start of step K (default)
//         checkpoint  while step K's checkpoint is written: after its files, before the rename
//                     (rank 0 only, the rank that writes checkpoints)
// A malformed value is a UsageError. Knows nothing of graphs, models or devices.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace autosp {

enum class FaultKind { exit, abort, crash, hang, nan };
enum class FaultWhere { step, checkpoint };

struct Fault {
  int rank = 0;
  int64_t step = 1;
  FaultKind kind = FaultKind::exit;
  FaultWhere where = FaultWhere::step;
};

// Parses an AUTOSP_FAULT value ("" = no fault). Malformed → UsageError naming AUTOSP_FAULT.
std::optional<Fault> parse_fault(const std::string& text);
// The fault in the environment, checked against the job: a rank outside the world, or
// where:checkpoint on a rank other than 0, is a UsageError.
std::optional<Fault> fault_from_env(int world_size);
// Fires `fault` when it names this rank, step and place; returns otherwise (kind nan: see below).
void inject_fault(const std::optional<Fault>& fault, FaultWhere where, int rank, int64_t step, Communicator& world);
// Kind nan: fills `grads` (f32/f64) with NaN when the fault names this rank and step.
void inject_nan(const std::optional<Fault>& fault, int rank, int64_t step, std::vector<Tensor>& grads);

// AUTOSP_COLLECTIVE_TIMEOUT in seconds (default 600); malformed or ≤ 0 → UsageError.
double collective_timeout_from_env();

class Watchdog {
 public:
  // `on_timeout(message)` runs on the watchdog's thread when one arm() lasts more than timeout_s
  // (it is meant to end the process: the watchdog fires at most once). The thread runs only when
  // `enabled` (a single process has nobody to wait for).
  Watchdog(double timeout_s, int rank, std::function<void(const std::string&)> on_timeout, bool enabled = true);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Start / stop timing one wait; `what` and `group` must outlive the wait (string literals, a
  // GuardedCommunicator's name).
  void arm(const char* what, const char* group);
  void disarm();
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  double timeout() const { return timeout_s_; }

 private:
  void loop();

  const double timeout_s_;
  const int rank_;
  std::function<void(const std::string&)> on_timeout_;
  std::atomic<int64_t> armed_at_ns_{0};  // steady_clock time of arm(), 0 = not armed
  std::atomic<const char*> what_{""}, group_{""};
  std::atomic<int64_t> step_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Every collective of `inner` runs between watchdog.arm() and disarm(). Does not own `inner`
// (except the groups its split() returns).
class GuardedCommunicator final : public Communicator {
 public:
  GuardedCommunicator(Communicator& inner, Watchdog& watchdog, std::string group);
  GuardedCommunicator(std::unique_ptr<Communicator> owned, Watchdog& watchdog, std::string group);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  void all_reduce_sum(Tensor& t) override;
  // Its wait() runs under the watchdog (test() never blocks, so it is not timed).
  std::unique_ptr<PendingCollective> all_reduce_sum_async(Tensor& t) override;
  void broadcast(Tensor& t, int root) override;
  void all_to_all(const Tensor& in, Tensor& out) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort(const std::string& message, int exit_code) override;

 private:
  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  Watchdog& watchdog_;
  std::string group_;
};

}  // namespace autosp
