// The calling thread's stream slot (device/stream_slot.h). The device side of leaving a slot,
// drain_stream_slot, is in device/cuda/device.cpp (a no-op in builds without CUDA).
#include "device/stream_slot.h"

#include <spdlog/spdlog.h>

#include <exception>

#include "device/cuda/device.h"
#include "tensor/check.h"

namespace autosp {
namespace {
thread_local int t_slot = 0;
}  // namespace

int stream_slot() { return t_slot; }

StreamSlotScope::StreamSlotScope(int slot) : slot_(slot) {
  AUTOSP_ASSERT(slot >= 0, "stream slot ", slot);
  AUTOSP_ASSERT(t_slot == 0, "stream slot ", slot, " entered by a thread already in slot ", t_slot);
  t_slot = slot;
}

StreamSlotScope::~StreamSlotScope() {
  if (left_) return;
  try {
    leave();
  } catch (const std::exception& e) {  // a destructor must not throw: the error is the body's to report
    spdlog::error("leaving stream slot {}: {}", slot_, e.what());
  }
}

void StreamSlotScope::leave() {
  left_ = true;
  t_slot = 0;
  drain_stream_slot(slot_);
}

}  // namespace autosp
