// Deadlines, id broadcast and collective size rules for the NCCL communicator (see nccl_support.h).
#include "comm/nccl_support.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace autosp::nccl_support {

WaitResult wait_with_deadline(double timeout_s, const std::function<Poll()>& poll) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto pause = std::chrono::microseconds(2);
  for (;;) {
    switch (poll()) {
      case Poll::done: return WaitResult::done;
      case Poll::failed: return WaitResult::failed;
      case Poll::pending: break;
    }
    if (std::chrono::duration<double>(clock::now() - start).count() >= timeout_s) return WaitResult::timed_out;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

std::vector<uint8_t> broadcast_bytes(Communicator& bootstrap, const std::vector<uint8_t>& bytes, int root) {
  const size_t words = (bytes.size() + 7) / 8;
  std::vector<int64_t> packed(std::max<size_t>(words, 1), 0);
  std::memcpy(packed.data(), bytes.data(), bytes.size());
  Tensor t = Tensor::from_vector<int64_t>({static_cast<int64_t>(packed.size())}, packed);
  bootstrap.broadcast(t, root);
  std::vector<uint8_t> out(bytes.size());
  std::memcpy(out.data(), t.raw(), bytes.size());
  return out;
}

size_t all_to_all_chunk(size_t in_bytes, size_t out_bytes, int P, size_t element_size) {
  AUTOSP_ASSERT(P >= 1, "all_to_all over ", P, " ranks");
  AUTOSP_ASSERT(in_bytes == out_bytes, "all_to_all: in holds ", in_bytes, " bytes, out ", out_bytes);
  AUTOSP_ASSERT(element_size > 0 && in_bytes % (static_cast<size_t>(P) * element_size) == 0, "all_to_all: ",
                in_bytes, " bytes do not split into ", P, " chunks of whole ", element_size, "-byte elements");
  return in_bytes / static_cast<size_t>(P) / element_size;
}

bool all_gather_in_place(const void* in, size_t in_bytes, const void* out, size_t out_bytes, int rank, int P) {
  AUTOSP_ASSERT(out_bytes == in_bytes * static_cast<size_t>(P), "all_gather: ", in_bytes, " bytes from ", P,
                " ranks into ", out_bytes);
  return in == static_cast<const char*>(out) + static_cast<size_t>(rank) * in_bytes;
}

}  // namespace autosp::nccl_support
