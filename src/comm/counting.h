// Communication accounting: CountingCommunicator forwards every collective to an inner
// Communicator (comm/forwarding.h) and records, per kind of collective, the number of calls, the bytes moved and the
// wall time spent inside the call. split() returns counting children that add into the same
// totals, so wrapping the world communicator handed to train() also counts the sp/dp groups the
// trainer's mesh splits off it. Used by autosp-bench and the communication-volume tests.
//
// Bytes moved, per call on this rank (`n` = the tensor's bytes, P = the group size):
//   all_to_all      n · (P-1)/P   the chunks this rank sends to other ranks (its own chunk stays)
//   all_reduce_sum  n             the buffer reduced (how many bytes the wire carries depends on the
//                                 algorithm: a ring moves 2(P-1)/P · n per rank; docs/scaling.md)
//   all_gather      n · (P-1)     this rank's input, sent to each other rank
//   reduce_scatter  n · (P-1)/P   the chunks of `in` this rank sends to their owners (its own stays);
//                                 with the all_gather of the result it is a ring all-reduce's 2(P-1)/P · n
//   broadcast       n             the buffer broadcast (on every rank, root or not)
//   send_recv       n             the buffer sent to the one peer (ring attention's block exchange)
//   barrier         0
// A collective over a group of one moves nothing: it counts as a call with 0 bytes.
// Time: steady-clock wall time of the inner call, so it includes waiting for slower ranks; for a
// non-blocking all-reduce or reduce-scatter, the time spent in its start, test() and wait() calls.
// Knows nothing of graphs or of what the tensors hold.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "comm/forwarding.h"

namespace autosp {

struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

struct CommStats {
  CollectiveStats all_reduce, all_to_all, all_gather, reduce_scatter, broadcast, barrier, send_recv;
  // Sum over every kind of collective.
  CollectiveStats total() const;
};

class CountingCommunicator final : public ForwardingCommunicator {
 public:
  // Wraps `inner` without owning it (it must outlive this object and its children).
  explicit CountingCommunicator(Communicator& inner);
  // Wraps and owns `inner`.
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner);

  // The totals of this communicator and of every communicator split off it (transitively).
  const CommStats& stats() const { return *stats_; }
  void reset_stats() { *stats_ = CommStats{}; }

 private:
  CountingCommunicator(std::unique_ptr<Communicator> owned, std::shared_ptr<CommStats> stats);

  // Times the call and counts it with its bytes (split is not counted). A non-blocking call is
  // counted when started; its time is what the caller spends inside the start, test() and wait()
  // calls (the exposed part: communication that ran behind compute costs nothing here).
  void around(const CommCall& c, const std::function<void()>& call) override;
  std::unique_ptr<PendingCollective> started(const CommCall& c, std::unique_ptr<PendingCollective> pending) override;
  // A counting group that adds into the same totals.
  std::unique_ptr<Communicator> wrap(std::unique_ptr<Communicator> group) override;
  CollectiveStats* stats_of(CommCall::Kind kind);  // null for split

  std::shared_ptr<CommStats> stats_;
};

}  // namespace autosp
