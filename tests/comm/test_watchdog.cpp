// The collective watchdog (comm/watchdog.h) and the guarded communicator (comm/guarded.h) in one
// process: the timeout setting, firing on a wait that outlasts it and only then, and a guarded
// communicator forwarding every call. The multi-rank behaviour is tests/mpi/fault_injection.sh.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "comm/guarded.h"
#include "comm/watchdog.h"
#include "common/env_var.h"

using namespace autosp;
using autosp::testing::EnvVar;

TEST_CASE("AUTOSP_COLLECTIVE_TIMEOUT parses or is a named error", "[fault]") {
  CHECK(collective_timeout_from_env() == 600.0);
  {
    EnvVar e("AUTOSP_COLLECTIVE_TIMEOUT", "2.5");
    CHECK(collective_timeout_from_env() == 2.5);
  }
  for (const char* v : {"0", "-1", "soon", "5s", "inf", "nan", "1e30"}) {
    INFO(v);
    EnvVar e("AUTOSP_COLLECTIVE_TIMEOUT", v);
    CHECK_THROWS_WITH(collective_timeout_from_env(), Catch::Contains("AUTOSP_COLLECTIVE_TIMEOUT"));
  }
}

TEST_CASE("the watchdog fires on a collective that outlasts the timeout, and only then", "[fault]") {
  std::atomic<int> fired{0};
  std::string message;
  std::mutex mu;
  auto on_timeout = [&](const std::string& m) {
    std::lock_guard<std::mutex> lk(mu);
    message = m;
    ++fired;
  };
  auto wait_for = [&](double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!fired && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  {
    Watchdog patient(2.0, 3, on_timeout);  // waits far shorter than the timeout never fire
    for (int i = 0; i < 10; ++i) {
      patient.arm("all_reduce_sum", "world");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      patient.disarm();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(fired == 0);
  }
  {
    Watchdog dog(0.2, 3, on_timeout);
    dog.set_step(7);
    wait_for(0.5);  // not armed: nothing happens
    CHECK(fired == 0);
    dog.arm("all_to_all", "sp");
    wait_for(5.0);
    REQUIRE(fired == 1);
    std::lock_guard<std::mutex> lk(mu);
    CHECK_THAT(message, Catch::Contains("rank 3 waited more than 0.2 s in all_to_all (group sp) at step 7"));
  }
  {
    Watchdog off(0.05, 0, on_timeout, /*enabled=*/false);  // a single process runs no thread
    off.arm("barrier", "world");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    off.disarm();
    CHECK(fired == 1);
  }

  // A guarded communicator forwards every call (here to one process) with the watchdog armed.
  Watchdog dog(60, 0, on_timeout);
  auto single = make_single_process_communicator();
  GuardedCommunicator g(*single, dog, "world");
  Tensor t = Tensor::from_vector<float>({3}, {1, 2, 3});
  g.all_reduce_sum(t);
  g.broadcast(t, 0);
  g.barrier();
  Tensor out = Tensor::empty({3}, DType::f32);
  g.all_to_all(t, out);
  CHECK(out.to_doubles() == std::vector<double>{1, 2, 3});
  auto child = g.split(0, 0);
  CHECK(child->size() == 1);
  child->barrier();
  CHECK(g.size() == 1);
  CHECK(g.rank() == 0);
}
