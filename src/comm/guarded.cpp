// Collectives under the watchdog.
#include "comm/guarded.h"

#include <cstdlib>

namespace autosp {

GuardedCommunicator::GuardedCommunicator(Communicator& inner, Watchdog& watchdog, std::string group)
    : inner_(&inner), watchdog_(watchdog), group_(std::move(group)) {}

GuardedCommunicator::GuardedCommunicator(std::unique_ptr<Communicator> owned, Watchdog& watchdog, std::string group)
    : owned_(std::move(owned)), inner_(owned_.get()), watchdog_(watchdog), group_(std::move(group)) {}

namespace {
// Arms the watchdog for the lifetime of one collective call.
struct Armed {
  Watchdog& w;
  Armed(Watchdog& w_, const char* what, const std::string& group) : w(w_) { w.arm(what, group.c_str()); }
  ~Armed() { w.disarm(); }
};
}  // namespace

void GuardedCommunicator::all_reduce_sum(Tensor& t) {
  Armed a(watchdog_, "all_reduce_sum", group_);
  inner_->all_reduce_sum(t);
}
namespace {
class GuardedPending final : public PendingCollective {
 public:
  GuardedPending(std::unique_ptr<PendingCollective> inner, Watchdog& w, const std::string& group, const char* what)
      : inner_(std::move(inner)), w_(w), group_(group), what_(what) {}
  bool test() override { return inner_->test(); }
  void wait() override {
    Armed a(w_, what_, group_);
    inner_->wait();
  }

 private:
  std::unique_ptr<PendingCollective> inner_;
  Watchdog& w_;
  const std::string& group_;
  const char* what_;
};
}  // namespace

std::unique_ptr<PendingCollective> GuardedCommunicator::all_reduce_sum_async(Tensor& t) {
  Armed a(watchdog_, "all_reduce_sum_async", group_);
  return std::make_unique<GuardedPending>(inner_->all_reduce_sum_async(t), watchdog_, group_, "all_reduce_sum_async");
}
void GuardedCommunicator::broadcast(Tensor& t, int root) {
  Armed a(watchdog_, "broadcast", group_);
  inner_->broadcast(t, root);
}
void GuardedCommunicator::all_to_all(const Tensor& in, Tensor& out) {
  Armed a(watchdog_, "all_to_all", group_);
  inner_->all_to_all(in, out);
}
void GuardedCommunicator::all_gather(const Tensor& in, Tensor& out) {
  Armed a(watchdog_, "all_gather", group_);
  inner_->all_gather(in, out);
}
std::unique_ptr<PendingCollective> GuardedCommunicator::all_gather_async(const Tensor& in, Tensor& out) {
  Armed a(watchdog_, "all_gather_async", group_);
  return std::make_unique<GuardedPending>(inner_->all_gather_async(in, out), watchdog_, group_, "all_gather_async");
}
void GuardedCommunicator::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  Armed a(watchdog_, "reduce_scatter_sum", group_);
  inner_->reduce_scatter_sum(in, out);
}
std::unique_ptr<PendingCollective> GuardedCommunicator::reduce_scatter_sum_async(const Tensor& in, Tensor& out) {
  Armed a(watchdog_, "reduce_scatter_sum_async", group_);
  return std::make_unique<GuardedPending>(inner_->reduce_scatter_sum_async(in, out), watchdog_, group_,
                                          "reduce_scatter_sum_async");
}
std::unique_ptr<PendingCollective> GuardedCommunicator::send_recv_async(const Tensor& send, int dest, Tensor& recv,
                                                                     int src) {
  Armed a(watchdog_, "send_recv_async", group_);
  return std::make_unique<GuardedPending>(inner_->send_recv_async(send, dest, recv, src), watchdog_, group_,
                                          "send_recv_async");
}
void GuardedCommunicator::barrier() {
  Armed a(watchdog_, "barrier", group_);
  inner_->barrier();
}
void GuardedCommunicator::abort(const std::string& message, int exit_code) {
  inner_->abort(message, exit_code);
  std::_Exit(exit_code);  // not reached
}
std::unique_ptr<Communicator> GuardedCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> child;
  {
    Armed a(watchdog_, "split", group_);
    child = inner_->split(color, key);
  }
  return std::make_unique<GuardedCommunicator>(std::move(child), watchdog_, group_ + ".split");
}

}  // namespace autosp
