// The CPU allocator: aligned host memory with live/peak accounting, and a cache of large blocks.
//
// A training step frees and asks again for the same large buffers every step (gradients handed to
// the optimizer, kernels' scratch), and glibc gives a block over its mmap threshold back to the
// kernel on free (and trims its heaps), so each step paid the page faults of touching them anew:
// about 20k faults (80 MiB) a Llama-768 step. Blocks of kCacheFrom bytes or more are therefore
// kept on free, by their size rounded to a page, and handed out again for the same rounded size,
// as PyTorch's CUDA caching allocator does; the cache holds at most the peak of live bytes seen
// (what the process has needed at once anyway), and a block that would pass that is freed. The
// accounting (live, peak) counts what is handed out, not what is cached. Under AddressSanitizer
// nothing is cached, so that a use after free stays visible.
#include "tensor/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

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

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCaching = false;
#else
constexpr bool kCaching = true;
#endif
constexpr size_t kCacheFrom = size_t(1) << 20;  // smaller blocks stay in glibc's heap, which reuses them
constexpr size_t kPage = 4096;

class CpuAllocator final : public Allocator {
 public:
  ~CpuAllocator() override {
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) std::free(p);
  }
  void* allocate(size_t nbytes) override {
    const size_t rounded = block_size(nbytes);
    void* p = nullptr;
    if (cached(rounded)) {
      const std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(rounded);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= rounded;
      }
    }
    if (!p) p = std::aligned_alloc(cached(rounded) ? kPage : 64, rounded);
    if (!p) throw RuntimeFailure(str("out of host memory allocating ", nbytes, " bytes"));
    note_alloc(nbytes);
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    note_free(nbytes);
    const size_t rounded = block_size(nbytes);
    if (cached(rounded)) {
      const std::lock_guard<std::mutex> lock(mu_);
      if (cached_bytes_ + rounded <= peak_bytes()) {
        free_[rounded].push_back(p);
        cached_bytes_ += rounded;
        return;
      }
    }
    std::free(p);
  }
  Device device() const override { return {}; }
  size_t cached_bytes() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

 private:
  static bool cached(size_t rounded) { return kCaching && rounded >= kCacheFrom; }
  // Rounded to 64 bytes, or to a page where the block may be cached (and page-aligned then).
  static size_t block_size(size_t nbytes) {
    const size_t at_least = nbytes == 0 ? 64 : nbytes;
    const size_t unit = kCaching && at_least >= kCacheFrom ? kPage : 64;
    return (at_least + unit - 1) / unit * unit;
  }

  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // rounded size → cached blocks
  size_t cached_bytes_ = 0;
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

size_t cpu_allocator_cached_bytes() { return static_cast<CpuAllocator&>(cpu_allocator()).cached_bytes(); }

}  // namespace autosp
