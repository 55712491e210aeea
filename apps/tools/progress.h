// Progress of long work for the apps (autosp-eval): on a terminal (stderr a TTY) one line redrawn in
// place, "passkey: 12/40 cells, 3.1 cells/s, ETA 0:09"; elsewhere (a log file, a pipe, CI) one line
// when a stage starts and one when it ends, so logs hold no carriage returns. Rank 0 only.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace autosp {

class Progress {
 public:
  // `stage` names the work ("perplexity by position"), `unit` its items ("sequences").
  Progress(std::string stage, std::string unit, bool enabled = true);
  // Items done of `total` (the first call starts the stage).
  void update(int64_t done, int64_t total);
  // Ends the stage: its line with the count, time and rate.
  void finish();

  // "1:05:09", "0:21": seconds as h:mm:ss or m:ss.
  static std::string clock(double seconds);

 private:
  std::string stage_, unit_;
  bool enabled_, tty_, started_ = false, finished_ = false;
  int64_t done_ = 0, total_ = 0;
  std::chrono::steady_clock::time_point t0_, last_draw_;
};

}  // namespace autosp
