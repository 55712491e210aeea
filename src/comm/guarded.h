// GuardedCommunicator: a Communicator whose every collective runs under the watchdog
// (comm/watchdog.h), so a peer that died or hangs ends the job instead of blocking it forever.
// A decorator (comm/forwarding.h): it adds the watchdog around each call and nothing else.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/forwarding.h"
#include "comm/watchdog.h"

namespace autosp {

// Every call of `inner` runs between watchdog.arm() and disarm(); a non-blocking one's wait()
// too (test() never blocks, so it is not timed). Does not own `inner` (except the groups its
// split() returns, named "<group>.split").
class GuardedCommunicator final : public ForwardingCommunicator {
 public:
  GuardedCommunicator(Communicator& inner, Watchdog& watchdog, std::string group);
  GuardedCommunicator(std::unique_ptr<Communicator> owned, Watchdog& watchdog, std::string group);

 private:
  void around(const CommCall& c, const std::function<void()>& call) override;
  std::unique_ptr<PendingCollective> started(const CommCall& c, std::unique_ptr<PendingCollective> pending) override;
  std::unique_ptr<Communicator> wrap(std::unique_ptr<Communicator> group) override;

  Watchdog& watchdog_;
  std::string group_;
};

}  // namespace autosp
