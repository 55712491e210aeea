// ForwardingCommunicator: every call to the inner communicator, through the decorator's hooks.
#include "comm/forwarding.h"

#include <cstdlib>

#include "tensor/check.h"

namespace autosp {
namespace {
int64_t bytes_of(const Tensor& t) { return static_cast<int64_t>(t.nbytes()); }
}  // namespace

ForwardingCommunicator::ForwardingCommunicator(Communicator& inner) : inner_(&inner) {}

ForwardingCommunicator::ForwardingCommunicator(std::unique_ptr<Communicator> owned)
    : owned_(std::move(owned)), inner_(owned_.get()) {
  AUTOSP_ASSERT(inner_, "a communicator decorator over no communicator");
}

void ForwardingCommunicator::around(const CommCall&, const std::function<void()>& call) { call(); }

std::unique_ptr<PendingCollective> ForwardingCommunicator::started(const CommCall&,
                                                                   std::unique_ptr<PendingCollective> pending) {
  return pending;
}

template <class F>
std::unique_ptr<PendingCollective> ForwardingCommunicator::start(const CommCall& c, F&& call) {
  std::unique_ptr<PendingCollective> pending;
  around(c, [&] { pending = call(); });
  return started(c, std::move(pending));
}

void ForwardingCommunicator::all_reduce_sum(Tensor& t) {
  around({CommCall::all_reduce, "all_reduce_sum", bytes_of(t)}, [&] { inner_->all_reduce_sum(t); });
}
std::unique_ptr<PendingCollective> ForwardingCommunicator::all_reduce_sum_async(Tensor& t) {
  return start({CommCall::all_reduce, "all_reduce_sum_async", bytes_of(t)},
               [&] { return inner_->all_reduce_sum_async(t); });
}
void ForwardingCommunicator::broadcast(Tensor& t, int root) {
  around({CommCall::broadcast, "broadcast", bytes_of(t)}, [&] { inner_->broadcast(t, root); });
}
void ForwardingCommunicator::all_to_all(const Tensor& in, Tensor& out) {
  around({CommCall::all_to_all, "all_to_all", bytes_of(in)}, [&] { inner_->all_to_all(in, out); });
}
void ForwardingCommunicator::all_gather(const Tensor& in, Tensor& out) {
  around({CommCall::all_gather, "all_gather", bytes_of(in)}, [&] { inner_->all_gather(in, out); });
}
std::unique_ptr<PendingCollective> ForwardingCommunicator::all_gather_async(const Tensor& in, Tensor& out) {
  return start({CommCall::all_gather, "all_gather_async", bytes_of(in)},
               [&] { return inner_->all_gather_async(in, out); });
}
void ForwardingCommunicator::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  around({CommCall::reduce_scatter, "reduce_scatter_sum", bytes_of(in)}, [&] { inner_->reduce_scatter_sum(in, out); });
}
std::unique_ptr<PendingCollective> ForwardingCommunicator::reduce_scatter_sum_async(const Tensor& in, Tensor& out) {
  return start({CommCall::reduce_scatter, "reduce_scatter_sum_async", bytes_of(in)},
               [&] { return inner_->reduce_scatter_sum_async(in, out); });
}
std::unique_ptr<PendingCollective> ForwardingCommunicator::send_recv_async(const Tensor& send, int dest, Tensor& recv,
                                                                           int src) {
  return start({CommCall::send_recv, "send_recv_async", bytes_of(send)},
               [&] { return inner_->send_recv_async(send, dest, recv, src); });
}
void ForwardingCommunicator::barrier() {
  around({CommCall::barrier, "barrier", 0}, [&] { inner_->barrier(); });
}
std::unique_ptr<Communicator> ForwardingCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> group;
  around({CommCall::split, "split", 0}, [&] { group = inner_->split(color, key); });
  return wrap(std::move(group));
}
void ForwardingCommunicator::abort(const std::string& message, int exit_code) {
  inner_->abort(message, exit_code);
  std::_Exit(exit_code);  // not reached (the inner abort does not return either), for the compiler's sake
}

}  // namespace autosp
