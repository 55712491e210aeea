// Progress lines (tools/progress.h).
#include "tools/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace autosp {

using Clock = std::chrono::steady_clock;

Progress::Progress(std::string stage, std::string unit, bool enabled)
    : stage_(std::move(stage)), unit_(std::move(unit)), enabled_(enabled), tty_(isatty(STDERR_FILENO) == 1) {}

std::string Progress::clock(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60) : fmt::format("{}:{:02}", s / 60, s % 60);
}

void Progress::update(int64_t done, int64_t total) {
  if (!enabled_) return;
  const auto now = Clock::now();
  if (!started_) {
    started_ = true;
    t0_ = now;
    if (!tty_) std::fprintf(stderr, "%s: %lld %s\n", stage_.c_str(), static_cast<long long>(total), unit_.c_str());
  }
  done_ = done, total_ = total;
  // On a terminal: redrawn at most 10 times a second, and for the last item.
  if (!tty_ || (now - last_draw_ < std::chrono::milliseconds(100) && done < total)) return;
  last_draw_ = now;
  const double secs = std::chrono::duration<double>(now - t0_).count();
  const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
  const std::string eta = rate > 0 ? clock(static_cast<double>(total - done) / rate) : "?";
  std::fprintf(stderr, "\r\033[K%s: %lld/%lld %s, %.2f %s/s, ETA %s", stage_.c_str(), static_cast<long long>(done),
               static_cast<long long>(total), unit_.c_str(), rate, unit_.c_str(), eta.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_ || !started_ || finished_) return;
  finished_ = true;
  const double secs = std::chrono::duration<double>(Clock::now() - t0_).count();
  std::fprintf(stderr, "%s%s: %lld/%lld %s in %s (%.2f %s/s)\n", tty_ ? "\r\033[K" : "", stage_.c_str(),
               static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(), clock(secs).c_str(),
               secs > 0 ? static_cast<double>(done_) / secs : 0.0, unit_.c_str());
}

}  // namespace autosp
