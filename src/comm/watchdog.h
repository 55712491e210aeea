// What keeps a multi-rank job from hanging: a thread that ends the whole job when this rank has
// waited in one collective for longer than AUTOSP_COLLECTIVE_TIMEOUT seconds (default 600). A rank
// that died or hung leaves the others blocked in their next collective, and MPI alone would wait
// forever. comm/guarded.h times every collective of a communicator with it; time spent computing
// or writing checkpoints is never counted. Knows nothing of graphs, models or devices.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace autosp {

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

}  // namespace autosp
