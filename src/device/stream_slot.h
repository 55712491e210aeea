// Which of a CUDA device's stream slots the calling thread's work goes to. A slot is one stream and
// the caching allocator whose blocks are reused in that stream's order (device/cuda/device.h).
// Slot 0 is every thread's by default. A thread rank (comm/threads.h) runs in slot rank + 1 for its
// whole life, and so does its communicator's worker thread, so P ranks on one GPU each enqueue on
// a stream of their own and allocate from an allocator of their own.
//
// The ordering a scope guarantees:
//   - entering: the first time a thread in slot s > 0 touches a device, slot s's stream waits for
//     the work queued so far on that device's slot-0 stream (the tensors the spawning thread made);
//   - leaving: the slot's streams this thread touched are drained, so the spawning thread may read
//     and free what the rank made once the rank's thread has ended.
// Plain host code, tested on the CPU; the device side is in device/cuda/device.cpp (no-ops in
// builds without CUDA).
#pragma once

namespace autosp {

// The calling thread's slot: 0 outside any StreamSlotScope.
int stream_slot();

class StreamSlotScope {
 public:
  // `slot` ≥ 0; scopes do not nest (a thread already in a slot > 0 is an internal error).
  explicit StreamSlotScope(int slot);
  // Leaves if leave() was not called; a device error while draining is then only logged.
  ~StreamSlotScope();
  StreamSlotScope(const StreamSlotScope&) = delete;
  StreamSlotScope& operator=(const StreamSlotScope&) = delete;

  // Drains this thread's streams of the slot (throws RuntimeFailure on an asynchronous kernel
  // failure) and returns the thread to slot 0.
  void leave();

 private:
  const int slot_;
  bool left_ = false;
};

}  // namespace autosp
