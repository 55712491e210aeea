// Catch2 entry point for autosp-mpi-tests. Creates the world communicator, runs the session on
// every rank (only rank 0 writes Catch's report; other ranks print one "rank N: FAILED ..." line per
// failed assertion), then sums the failure counts so every rank exits non-zero if any rank failed.
// The listener base class is one of Catch2's external interfaces (its implementation: autosp-catch).
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/catch_session.h"
#include "mpi/mpi_test.h"

namespace autosp::test {
namespace {

std::unique_ptr<Communicator> g_world;

// On ranks other than 0 the report goes to /dev/null; this listener keeps their failures visible.
struct RankFailureListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    const Catch::AssertionResult& r = stats.assertionResult;
    if (g_world && g_world->rank() != 0 && !r.isOk()) {
      std::string what = r.hasExpression() ? r.getExpressionInMacro() : "";
      if (r.hasExpandedExpression() && r.getExpandedExpression() != r.getExpression())
        what += " with expansion " + r.getExpandedExpression();
      if (r.hasMessage()) what += (what.empty() ? "" : ": ") + r.getMessage();
      std::fprintf(stderr, "rank %d: FAILED %s:%zu: in \"%s\": %s\n", g_world->rank(), r.getSourceInfo().file,
                   r.getSourceInfo().line, currentTestCaseInfo ? currentTestCaseInfo->name.c_str() : "?",
                   what.c_str());
    }
    return true;
  }
};
CATCH_REGISTER_LISTENER(RankFailureListener)

}  // namespace

Communicator& test_world() { return *g_world; }

TempDir shared_temp_dir(Communicator& w, const std::string& tag) {
  Tensor pid = Tensor::from_vector<int64_t>({1}, {w.rank() == 0 ? static_cast<int64_t>(::getpid()) : 0});
  w.broadcast(pid, 0);
  return TempDir("mpi-" + tag, pid.data<int64_t>()[0], w.rank() == 0);
}

}  // namespace autosp::test

int main(int argc, char** argv) {
  using autosp::test::g_world;
  g_world = autosp::make_world_communicator();
  const int rank = g_world->rank();

  // A bad command line fails every rank alike (the same arguments), before any test runs.
  const int failed = autosp::test::run_catch_session(argc, argv, rank != 0);

  autosp::Tensor total = autosp::Tensor::from_vector<int64_t>({1}, {failed});
  g_world->all_reduce_sum(total);
  const int64_t all_failed = total.data<int64_t>()[0];
  if (rank != 0 && failed) std::fprintf(stderr, "rank %d: FAILED %d test case(s)\n", rank, failed);
  if (rank == 0 && g_world->size() > 1)
    std::printf("%d ranks: %lld failed test case(s) in total\n", g_world->size(), static_cast<long long>(all_failed));
  g_world.reset();  // before MPI is finalised at exit
  return all_failed ? 1 : 0;
}
