// A two-rank job where rank 1 calls abort() while rank 0 waits in a barrier: abort() must end the
// whole job (tests/mpi/abort_probe.sh checks the exit code, the error line, and that it is quick).
#include <cstdio>

#include "comm/communicator.h"

int main() {
  auto world = autosp::make_world_communicator();
  if (world->size() < 2) {
    std::fprintf(stderr, "abort_probe: needs at least 2 ranks, got %d\n", world->size());
    return 1;
  }
  if (world->rank() == 1) world->abort("probe", 3);
  world->barrier();  // never completes: rank 1 is gone
  std::fprintf(stderr, "abort_probe: rank %d passed the barrier\n", world->rank());
  return 0;
}
