// CountingCommunicator: forwarding with per-collective call counts, bytes and wall time.
#include "comm/counting.h"

#include <chrono>

namespace autosp {
namespace {

// The bytes one call moves on a group of `P` ranks (the table in counting.h); `bytes` is the
// tensor's (CommCall::bytes).
int64_t moved(CommCall::Kind kind, int64_t P, int64_t bytes) {
  if (P <= 1) return 0;  // a group of one moves nothing
  switch (kind) {
    case CommCall::all_to_all:
    case CommCall::reduce_scatter: return bytes / P * (P - 1);
    case CommCall::all_gather: return bytes * (P - 1);
    default: return bytes;  // all_reduce, broadcast, send_recv; barrier: 0
  }
}

void add(CollectiveStats& into, const CollectiveStats& s) {
  into.calls += s.calls;
  into.bytes += s.bytes;
  into.seconds += s.seconds;
}

}  // namespace

CollectiveStats CommStats::total() const {
  CollectiveStats t;
  for (const CollectiveStats* s : {&all_reduce, &all_to_all, &all_gather, &reduce_scatter, &broadcast, &barrier, &send_recv}) add(t, *s);
  return t;
}

CountingCommunicator::CountingCommunicator(Communicator& inner)
    : ForwardingCommunicator(inner), stats_(std::make_shared<CommStats>()) {}

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> inner)
    : CountingCommunicator(std::move(inner), std::make_shared<CommStats>()) {}

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> owned, std::shared_ptr<CommStats> stats)
    : ForwardingCommunicator(std::move(owned)), stats_(std::move(stats)) {}

CollectiveStats* CountingCommunicator::stats_of(CommCall::Kind kind) {
  switch (kind) {
    case CommCall::all_reduce: return &stats_->all_reduce;
    case CommCall::all_to_all: return &stats_->all_to_all;
    case CommCall::all_gather: return &stats_->all_gather;
    case CommCall::reduce_scatter: return &stats_->reduce_scatter;
    case CommCall::broadcast: return &stats_->broadcast;
    case CommCall::send_recv: return &stats_->send_recv;
    case CommCall::barrier: return &stats_->barrier;
    case CommCall::split: return nullptr;
  }
  return nullptr;
}

void CountingCommunicator::around(const CommCall& c, const std::function<void()>& call) {
  CollectiveStats* s = stats_of(c.kind);
  if (!s) return call();
  const auto t0 = std::chrono::steady_clock::now();
  call();
  s->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s->calls += 1;
  s->bytes += moved(c.kind, size(), c.bytes);
}

namespace {
// Adds the time spent in test() and wait() to the collective's seconds.
class CountedPending final : public PendingCollective {
 public:
  CountedPending(std::unique_ptr<PendingCollective> inner, CollectiveStats& s) : inner_(std::move(inner)), s_(s) {}
  bool test() override {
    bool done = false;
    timed([&] { done = inner_->test(); });
    return done;
  }
  void wait() override { timed([&] { inner_->wait(); }); }

 private:
  template <class F>
  void timed(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    s_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::unique_ptr<PendingCollective> inner_;
  CollectiveStats& s_;
};
}  // namespace

std::unique_ptr<PendingCollective> CountingCommunicator::started(const CommCall& c,
                                                                 std::unique_ptr<PendingCollective> pending) {
  return std::make_unique<CountedPending>(std::move(pending), *stats_of(c.kind));
}

std::unique_ptr<Communicator> CountingCommunicator::wrap(std::unique_ptr<Communicator> group) {
  return std::unique_ptr<Communicator>(new CountingCommunicator(std::move(group), stats_));
}

}  // namespace autosp
