// ForwardingCommunicator: the base of the communicator decorators (comm/counting.h counts,
// comm/guarded.h runs each call under the watchdog). It holds the inner communicator and forwards
// every Communicator call to it through three hooks, so a decorator says only what it adds: what
// it does around each call (around), what it does to the handle of a non-blocking one (started),
// and how it decorates a group split off the inner communicator (wrap). Knows nothing of graphs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace autosp {

// One call as a decorator sees it.
struct CommCall {
  enum Kind { all_reduce, all_to_all, all_gather, reduce_scatter, broadcast, send_recv, barrier, split };
  Kind kind;
  const char* name;  // the Communicator method called: "all_reduce_sum_async", "split", ...
  int64_t bytes;     // the bytes of the tensor handed in (`in`, `send`, or the in-place buffer); 0: none
};

class ForwardingCommunicator : public Communicator {
 public:
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  void all_reduce_sum(Tensor& t) override;
  std::unique_ptr<PendingCollective> all_reduce_sum_async(Tensor& t) override;
  void broadcast(Tensor& t, int root) override;
  void all_to_all(const Tensor& in, Tensor& out) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  std::unique_ptr<PendingCollective> all_gather_async(const Tensor& in, Tensor& out) override;
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override;
  std::unique_ptr<PendingCollective> reduce_scatter_sum_async(const Tensor& in, Tensor& out) override;
  std::unique_ptr<PendingCollective> send_recv_async(const Tensor& send, int dest, Tensor& recv, int src) override;
  void barrier() override;
  // The inner communicator's split (inside around), decorated by wrap.
  std::unique_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort(const std::string& message, int exit_code) override;

 protected:
  // Forwards to `inner` without owning it (it must outlive this object).
  explicit ForwardingCommunicator(Communicator& inner);
  // Forwards to `owned` and owns it.
  explicit ForwardingCommunicator(std::unique_ptr<Communicator> owned);

  // Runs `call`, the call on the inner communicator (for a non-blocking one, its start). The
  // default adds nothing.
  virtual void around(const CommCall& c, const std::function<void()>& call);
  // The handle a non-blocking call returns. The default hands back the inner one.
  virtual std::unique_ptr<PendingCollective> started(const CommCall& c, std::unique_ptr<PendingCollective> pending);
  // The decorated communicator of `group`, a group split off the inner communicator.
  virtual std::unique_ptr<Communicator> wrap(std::unique_ptr<Communicator> group) = 0;

 private:
  // around(c, `call`), then started(c, what `call` returned).
  template <class F>
  std::unique_ptr<PendingCollective> start(const CommCall& c, F&& call);

  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
};

}  // namespace autosp
