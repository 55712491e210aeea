// The NCCL unique id's way to every rank (nccl_support::broadcast_bytes over the MPI world, as
// make_nccl_communicator sends it): rank `root`'s bytes arrive intact everywhere, odd sizes too.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "comm/nccl_support.h"
#include "mpi/mpi_test.h"

namespace autosp::test {
namespace {

TEST_CASE("mpi: broadcast_bytes delivers the root's id", "[mpi][nccl]") {
  Communicator& w = test_world();
  for (int root : {0, w.size() - 1}) {
    for (size_t n : {size_t{128}, size_t{13}}) {
      std::vector<uint8_t> mine(n), expect(n);
      for (size_t i = 0; i < n; ++i) {
        mine[i] = static_cast<uint8_t>(w.rank() * 31 + i);
        expect[i] = static_cast<uint8_t>(root * 31 + i);
      }
      const std::vector<uint8_t> got = nccl_support::broadcast_bytes(w, mine, root);
      CHECK(got == expect);
    }
  }
}

}  // namespace
}  // namespace autosp::test
