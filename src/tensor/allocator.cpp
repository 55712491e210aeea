// The CPU allocator: aligned host memory with live/peak accounting.
#include "tensor/allocator.h"

#include <cstdlib>
#include <new>

#include "tensor/check.h"

namespace autosp {

std::string_view device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return "cuda";
  }
  return "unknown device";
}

std::string Device::str() const {
  return kind == DeviceKind::cpu ? "cpu" : autosp::str(device_kind_name(kind), ":", index);
}

void Allocator::note_alloc(size_t n) {
  size_t now = (live_ += n);
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

namespace {
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) throw RuntimeFailure(str("out of host memory allocating ", nbytes, " bytes"));
    note_alloc(nbytes);
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    std::free(p);
    note_free(nbytes);
  }
  Device device() const override { return {}; }
};
}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

}  // namespace autosp
