// The collective watchdog (AUTOSP_COLLECTIVE_TIMEOUT).
#include "comm/watchdog.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "tensor/check.h"

namespace autosp {
namespace {
constexpr const char* kTimeoutVar = "AUTOSP_COLLECTIVE_TIMEOUT";
}  // namespace

double collective_timeout_from_env() {
  const char* v = std::getenv(kTimeoutVar);
  if (!v || !*v) return 600.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(s) || s <= 0 || s > 1e7)
    throw UsageError(str(kTimeoutVar, "='", v, "': expected a number of seconds in (0, 1e7]"));
  return s;
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Watchdog::Watchdog(double timeout_s, int rank, std::function<void(const std::string&)> on_timeout, bool enabled)
    : timeout_s_(timeout_s), rank_(rank), on_timeout_(std::move(on_timeout)) {
  if (enabled) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::arm(const char* what, const char* group) {
  what_.store(what, std::memory_order_relaxed);
  group_.store(group, std::memory_order_relaxed);
  armed_at_ns_.store(now_ns(), std::memory_order_release);
}

void Watchdog::disarm() { armed_at_ns_.store(0, std::memory_order_release); }

// Polls a few times per timeout (at most once a second), so arm() and disarm() are two atomic
// stores: no lock, no wake-up on the collectives' path.
void Watchdog::loop() {
  const auto timeout_ns = static_cast<int64_t>(timeout_s_ * 1e9);
  const auto period = std::chrono::nanoseconds(std::clamp<int64_t>(timeout_ns / 8, 10'000'000, 1'000'000'000));
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, period, [this] { return stop_; })) {
    const int64_t since = armed_at_ns_.load(std::memory_order_acquire);
    if (since == 0 || now_ns() - since < timeout_ns) continue;
    const std::string msg =
        str("rank ", rank_, " waited more than ", timeout_s_, " s in ", what_.load(), " (group ", group_.load(),
            ") at step ", step_.load(), ": another rank has died or hangs; aborting the job (",
            kTimeoutVar, " sets the limit)");
    lk.unlock();
    on_timeout_(msg);
    return;
  }
}

}  // namespace autosp
