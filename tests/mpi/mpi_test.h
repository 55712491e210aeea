// Shared by the multi-rank tests (autosp-mpi-tests, run under mpirun by ctest -L mpi): the world
// communicator that tests/mpi/main.cpp creates once for the whole run. Every rank runs the same
// test cases in the same order, so a collective in a test is matched on every rank; check results
// with CHECK after the collectives, not REQUIRE between them, or a failing rank leaves the others
// waiting.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "common/temp_dir.h"

namespace autosp::test {

Communicator& test_world();

// A temporary directory that every rank of w names alike (rank 0's pid, broadcast): rank 0 makes
// it empty and removes it when the object goes. Put a barrier before the end of its scope when
// other ranks still read it.
TempDir shared_temp_dir(Communicator& w, const std::string& tag);

}  // namespace autosp::test
