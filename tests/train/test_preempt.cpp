// Preemption signals (train/preempt.h): the first SIGTERM/SIGINT/SIGUSR1 is recorded, not fatal; a
// second one ends the process at once with 128 + signal; a run that does not stop within the save
// timeout exits 3. The fatal cases run in forked children, judged by their exit status.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "train/preempt.h"

using namespace autosp;

namespace {

// Exit status of a child running `body` (then exiting 0), and how long it took in seconds.
std::pair<int, double> in_child(const std::function<void()>& body) {
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, s};
}

}  // namespace

TEST_CASE("the first preemption signal is recorded, not fatal", "[preempt]") {
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) {
    INFO("signal " << sig);
    StopOnSignal stop(60);
    CHECK(StopOnSignal::received() == 0);
    ::raise(sig);
    CHECK(StopOnSignal::received() == sig);
  }
  StopOnSignal fresh(60);  // each run starts clean
  CHECK(StopOnSignal::received() == 0);
}

TEST_CASE("a second signal exits at once; a stop that overruns the save timeout exits 3", "[preempt]") {
  auto [twice, t_twice] = in_child([] {
    StopOnSignal stop(60);
    ::raise(SIGTERM);
    ::raise(SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(5));
  });
  CHECK(twice == 128 + SIGTERM);
  CHECK(t_twice < 4);
  auto [overrun, t_overrun] = in_child([] {
    StopOnSignal stop(0.3);
    ::raise(SIGUSR1);
    std::this_thread::sleep_for(std::chrono::seconds(10));  // a save that never finishes
  });
  CHECK(overrun == 3);
  CHECK(t_overrun < 8);
  auto [finished, t_finished] = in_child([] {
    StopOnSignal stop(0.5);
    ::raise(SIGTERM);  // the run stops in time: the guard ends with it
  });
  CHECK(finished == 0);
  CHECK(t_finished < 5);
}
