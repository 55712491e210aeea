// Collectives under the watchdog.
#include "comm/guarded.h"

namespace autosp {

GuardedCommunicator::GuardedCommunicator(Communicator& inner, Watchdog& watchdog, std::string group)
    : ForwardingCommunicator(inner), watchdog_(watchdog), group_(std::move(group)) {}

GuardedCommunicator::GuardedCommunicator(std::unique_ptr<Communicator> owned, Watchdog& watchdog, std::string group)
    : ForwardingCommunicator(std::move(owned)), watchdog_(watchdog), group_(std::move(group)) {}

namespace {
// Arms the watchdog for the lifetime of one collective call.
struct Armed {
  Watchdog& w;
  Armed(Watchdog& w_, const char* what, const std::string& group) : w(w_) { w.arm(what, group.c_str()); }
  ~Armed() { w.disarm(); }
};

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

void GuardedCommunicator::around(const CommCall& c, const std::function<void()>& call) {
  Armed a(watchdog_, c.name, group_);
  call();
}

std::unique_ptr<PendingCollective> GuardedCommunicator::started(const CommCall& c,
                                                                std::unique_ptr<PendingCollective> pending) {
  return std::make_unique<GuardedPending>(std::move(pending), watchdog_, group_, c.name);
}

std::unique_ptr<Communicator> GuardedCommunicator::wrap(std::unique_ptr<Communicator> group) {
  return std::make_unique<GuardedCommunicator>(std::move(group), watchdog_, group_ + ".split");
}

}  // namespace autosp
