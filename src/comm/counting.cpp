// CountingCommunicator: forwarding with per-collective call counts, bytes and wall time.
#include "comm/counting.h"

#include <chrono>

namespace autosp {
namespace {

// Times `call` and adds one call of `bytes` (0 on a group of one) to `s`.
template <class F>
void counted(CollectiveStats& s, int group_size, int64_t bytes, F&& call) {
  const auto t0 = std::chrono::steady_clock::now();
  call();
  s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.calls += 1;
  s.bytes += group_size > 1 ? bytes : 0;
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
    : inner_(&inner), stats_(std::make_shared<CommStats>()) {}

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> inner)
    : CountingCommunicator(std::move(inner), std::make_shared<CommStats>()) {}

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> owned, std::shared_ptr<CommStats> stats)
    : owned_(std::move(owned)), inner_(owned_.get()), stats_(std::move(stats)) {
  AUTOSP_ASSERT(inner_, "CountingCommunicator over no communicator");
}

void CountingCommunicator::all_reduce_sum(Tensor& t) {
  const auto n = static_cast<int64_t>(t.nbytes());
  counted(stats_->all_reduce, size(), n, [&] { inner_->all_reduce_sum(t); });
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

std::unique_ptr<PendingCollective> CountingCommunicator::all_reduce_sum_async(Tensor& t) {
  const auto n = static_cast<int64_t>(t.nbytes());
  std::unique_ptr<PendingCollective> pending;
  counted(stats_->all_reduce, size(), n, [&] { pending = inner_->all_reduce_sum_async(t); });
  return std::make_unique<CountedPending>(std::move(pending), stats_->all_reduce);
}

void CountingCommunicator::broadcast(Tensor& t, int root) {
  const auto n = static_cast<int64_t>(t.nbytes());
  counted(stats_->broadcast, size(), n, [&] { inner_->broadcast(t, root); });
}

void CountingCommunicator::all_to_all(const Tensor& in, Tensor& out) {
  const int64_t P = size(), n = static_cast<int64_t>(in.nbytes());
  counted(stats_->all_to_all, size(), n / P * (P - 1), [&] { inner_->all_to_all(in, out); });
}

void CountingCommunicator::all_gather(const Tensor& in, Tensor& out) {
  const int64_t P = size(), n = static_cast<int64_t>(in.nbytes());
  counted(stats_->all_gather, size(), n * (P - 1), [&] { inner_->all_gather(in, out); });
}

std::unique_ptr<PendingCollective> CountingCommunicator::all_gather_async(const Tensor& in, Tensor& out) {
  const int64_t P = size(), n = static_cast<int64_t>(in.nbytes());
  std::unique_ptr<PendingCollective> pending;
  counted(stats_->all_gather, size(), n * (P - 1), [&] { pending = inner_->all_gather_async(in, out); });
  return std::make_unique<CountedPending>(std::move(pending), stats_->all_gather);
}

void CountingCommunicator::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  const int64_t P = size(), n = static_cast<int64_t>(in.nbytes());
  counted(stats_->reduce_scatter, size(), n / P * (P - 1), [&] { inner_->reduce_scatter_sum(in, out); });
}

std::unique_ptr<PendingCollective> CountingCommunicator::reduce_scatter_sum_async(const Tensor& in, Tensor& out) {
  const int64_t P = size(), n = static_cast<int64_t>(in.nbytes());
  std::unique_ptr<PendingCollective> pending;
  counted(stats_->reduce_scatter, size(), n / P * (P - 1), [&] { pending = inner_->reduce_scatter_sum_async(in, out); });
  return std::make_unique<CountedPending>(std::move(pending), stats_->reduce_scatter);
}

std::unique_ptr<PendingCollective> CountingCommunicator::send_recv_async(const Tensor& send, int dest, Tensor& recv,
                                                                      int src) {
  const auto n = static_cast<int64_t>(send.nbytes());
  std::unique_ptr<PendingCollective> pending;
  counted(stats_->send_recv, size(), n, [&] { pending = inner_->send_recv_async(send, dest, recv, src); });
  return std::make_unique<CountedPending>(std::move(pending), stats_->send_recv);
}
void CountingCommunicator::barrier() {
  counted(stats_->barrier, size(), 0, [&] { inner_->barrier(); });
}

std::unique_ptr<Communicator> CountingCommunicator::split(int color, int key) {
  return std::unique_ptr<Communicator>(new CountingCommunicator(inner_->split(color, key), stats_));
}

}  // namespace autosp
