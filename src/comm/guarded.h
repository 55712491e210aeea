// GuardedCommunicator: a Communicator whose every collective runs under the watchdog
// (comm/watchdog.h), so a peer that died or hangs ends the job instead of blocking it forever.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/watchdog.h"

namespace autosp {

// Every collective of `inner` runs between watchdog.arm() and disarm(). Does not own `inner`
// (except the groups its split() returns).
class GuardedCommunicator final : public Communicator {
 public:
  GuardedCommunicator(Communicator& inner, Watchdog& watchdog, std::string group);
  GuardedCommunicator(std::unique_ptr<Communicator> owned, Watchdog& watchdog, std::string group);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  void all_reduce_sum(Tensor& t) override;
  // Its wait() runs under the watchdog (test() never blocks, so it is not timed).
  std::unique_ptr<PendingCollective> all_reduce_sum_async(Tensor& t) override;
  void broadcast(Tensor& t, int root) override;
  void all_to_all(const Tensor& in, Tensor& out) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  // Its wait() runs under the watchdog, as all_reduce_sum_async's.
  std::unique_ptr<PendingCollective> all_gather_async(const Tensor& in, Tensor& out) override;
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override;
  // Its wait() runs under the watchdog, as all_reduce_sum_async's.
  std::unique_ptr<PendingCollective> reduce_scatter_sum_async(const Tensor& in, Tensor& out) override;
  // Its wait() runs under the watchdog, as all_reduce_sum_async's.
  std::unique_ptr<PendingCollective> send_recv_async(const Tensor& send, int dest, Tensor& recv, int src) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort(const std::string& message, int exit_code) override;

 private:
  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  Watchdog& watchdog_;
  std::string group_;
};

}  // namespace autosp
