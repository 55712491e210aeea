// Shared by the multi-rank tests (autosp-mpi-tests, run under mpirun by ctest -L mpi): the world
// communicator that tests/mpi/main.cpp creates once for the whole run. Every rank runs the same
// test cases in the same order, so a collective in a test is matched on every rank; check results
// with CHECK after the collectives, not REQUIRE between them, or a failing rank leaves the others
// waiting.
#pragma once

#include "comm/communicator.h"

namespace autosp::test {

Communicator& test_world();

}  // namespace autosp::test
