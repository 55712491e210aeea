// The host-side logic of the NCCL communicator that needs no GPU (comm/nccl_support.h): waiting
// with a deadline, the unique-id broadcast over the single-process bootstrap, the collectives' size
// rules; and, in builds without NCCL, that the factory refuses with a clear message.
#include <catch2/catch.hpp>

#include <chrono>
#include <stdexcept>

#include "comm/nccl.h"
#include "comm/nccl_support.h"

using namespace autosp;
using namespace autosp::nccl_support;

TEST_CASE("nccl support: wait_with_deadline", "[nccl]") {
  int calls = 0;
  CHECK(wait_with_deadline(5, [&] { return ++calls < 4 ? Poll::pending : Poll::done; }) == WaitResult::done);
  CHECK(calls == 4);
  calls = 0;
  CHECK(wait_with_deadline(5, [&] { return ++calls < 2 ? Poll::pending : Poll::failed; }) == WaitResult::failed);
  CHECK(calls == 2);

  // A poll that never finishes times out after about the deadline, not much later.
  calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(wait_with_deadline(0.05, [&] { ++calls; return Poll::pending; }) == WaitResult::timed_out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s >= 0.05);
  CHECK(s < 2.0);
  CHECK(calls >= 2);

  // Zero deadline: one look, then timed out.
  calls = 0;
  CHECK(wait_with_deadline(0, [&] { ++calls; return Poll::pending; }) == WaitResult::timed_out);
  CHECK(calls == 1);
}

TEST_CASE("nccl support: broadcast_bytes over one rank", "[nccl]") {
  auto single = make_single_process_communicator();
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{128}, size_t{129}}) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 1);
    CHECK(broadcast_bytes(*single, bytes, 0) == bytes);
  }
  CHECK(broadcast_bytes(*single, {}, 0).empty());
}

TEST_CASE("nccl support: collective size rules", "[nccl]") {
  CHECK(all_to_all_chunk(64, 64, 4, 1) == 16);
  CHECK(all_to_all_chunk(64, 64, 4, 2) == 8);
  CHECK(all_to_all_chunk(0, 0, 3, 4) == 0);
  CHECK_THROWS_WITH(all_to_all_chunk(64, 32, 2, 1), Catch::Contains("in holds 64 bytes, out 32"));
  CHECK_THROWS_WITH(all_to_all_chunk(60, 60, 8, 1), Catch::Contains("do not split into 8 chunks"));
  CHECK_THROWS_WITH(all_to_all_chunk(24, 24, 4, 4), Catch::Contains("4-byte elements"));

  char out[40];
  CHECK(all_gather_in_place(out + 20, 10, out, 40, 2, 4));
  CHECK_FALSE(all_gather_in_place(out + 10, 10, out, 40, 2, 4));
  char in[10];
  CHECK_FALSE(all_gather_in_place(in, 10, out, 40, 0, 4));
  CHECK_THROWS_WITH(all_gather_in_place(in, 10, out, 30, 0, 4), Catch::Contains("into 30"));
}

TEST_CASE("nccl support: the factory of a build without NCCL refuses", "[nccl]") {
  if (nccl_built()) return;  // needs a GPU: tests/cuda/nccl_test.cpp
  auto single = make_single_process_communicator();
  CHECK_THROWS_AS(make_nccl_communicator(*single, nullptr, 10), RuntimeFailure);
  CHECK_THROWS_WITH(make_nccl_communicator(*single, nullptr, 10), Catch::Contains("no NCCL backend"));
}
