// Signal handlers that only record the signal (async-signal-safe), and a thread that enforces the
// save deadline from outside the handler.
#include "train/preempt.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <spdlog/spdlog.h>

namespace autosp {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
std::atomic<int> g_signal{0};
struct sigaction g_previous[3];
// Ranks that are threads of one process (comm/threads.h) each hold a StopOnSignal: the first
// installs the handlers, the last restores the previous ones, and one of them warns.
std::mutex g_install_mu;
int g_installs = 0;
std::atomic<bool> g_warned{false};

void on_signal(int sig) {
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, sig)) ::_exit(128 + sig);  // the second signal
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace

StopOnSignal::StopOnSignal(double save_timeout_s) : timeout_s_(save_timeout_s) {
  {
    std::lock_guard<std::mutex> lock(g_install_mu);
    if (g_installs++ == 0) {
      g_signal.store(0);
      g_warned.store(false);
      struct sigaction sa {};
      sa.sa_handler = on_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;
      for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &g_previous[i]);
    }
  }
  deadline_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_ && g_signal.load() == 0) cv_.wait_for(lock, std::chrono::milliseconds(50));
    if (done_) return;
    const int sig = g_signal.load();
    if (!g_warned.exchange(true))
      spdlog::warn("{} received: finishing this step and saving a checkpoint (within {} s; a second signal "
                   "stops at once)", signal_name(sig), timeout_s_);
    if (cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), [this] { return done_; })) return;
    spdlog::error("{} received {} s ago and the run has not stopped: exiting without a checkpoint",
                  signal_name(sig), timeout_s_);
    if (auto file = spdlog::get("train.log")) file->flush();
    std::fprintf(stderr, "error: %s received and no checkpoint saved within train.save_timeout (%g s)\n",
                 signal_name(sig), timeout_s_);
    ::_exit(3);
  });
}

StopOnSignal::~StopOnSignal() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  deadline_.join();
  std::lock_guard<std::mutex> lock(g_install_mu);
  if (--g_installs == 0)
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
}

int StopOnSignal::received() { return g_signal.load(); }

bool StopOnSignal::stop_agreed(Communicator& world) const {
  if (world.size() == 1) return received() != 0;
  Tensor flag = Tensor::from_vector<int64_t>({1}, {received() != 0 ? 1 : 0});
  world.all_reduce_sum(flag);
  return flag.data<int64_t>()[0] > 0;
}

}  // namespace autosp
