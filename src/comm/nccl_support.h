// Host-side pieces of the NCCL communicator (comm/nccl.cpp) that need neither NCCL nor CUDA, so the
// CPU test suite checks them in every build: waiting with a deadline, moving an opaque id (NCCL's
// unique id) from one rank to all over a bootstrap Communicator, and the size rules of the
// collectives. Knows nothing of graphs or devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace autosp::nccl_support {

// What one look at an asynchronous operation says.
enum class Poll { pending, done, failed };
enum class WaitResult { done, failed, timed_out };

// Calls `poll` until it says done or failed, or until `timeout_s` seconds have passed (then
// timed_out; `poll` has been called at least once). Sleeps between polls, starting at a few
// microseconds and backing off to 1 ms, so a wait of seconds costs little CPU.
WaitResult wait_with_deadline(double timeout_s, const std::function<Poll()>& poll);

// Rank `root`'s `bytes` on every rank of `bootstrap` (a collective: every rank calls it; the other
// ranks' `bytes` only give the size, which must be the same everywhere). Sent as an i64 CPU tensor,
// so it works over the MPI and single-process backends.
std::vector<uint8_t> broadcast_bytes(Communicator& bootstrap, const std::vector<uint8_t>& bytes, int root);

// all_to_all over P ranks: in and out hold the same bytes, P equal chunks of whole elements.
// Returns the elements per chunk (the `count` of ncclAlltoAll); a violation is an AUTOSP_ASSERT
// naming both sizes.
size_t all_to_all_chunk(size_t in_bytes, size_t out_bytes, int P, size_t element_size);

// all_gather: out holds P × in bytes. True when `in` already sits in this rank's slot of `out`
// (NCCL's and MPI's in-place case).
bool all_gather_in_place(const void* in, size_t in_bytes, const void* out, size_t out_bytes, int rank, int P);

}  // namespace autosp::nccl_support
