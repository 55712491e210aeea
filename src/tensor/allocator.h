// Allocators: where tensor storage comes from. The CPU allocator is here; the CUDA caching allocator
// implements the same interface in src/device/cuda. Every allocator tracks live and peak bytes, which
// is what the executor reports as peak memory. Knows nothing of graphs.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace autosp {

enum class DeviceKind : uint8_t { cpu, cuda };
std::string_view device_kind_name(DeviceKind k);  // "cpu", "cuda" (runtime.device's spelling)

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* p, size_t nbytes) = 0;
  virtual Device device() const = 0;

  size_t live_bytes() const { return live_.load(); }
  size_t peak_bytes() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

 protected:
  void note_alloc(size_t n);
  void note_free(size_t n) { live_ -= n; }

 private:
  std::atomic<size_t> live_{0}, peak_{0};
};

// 64-byte aligned host memory; blocks of 1 MiB or more are kept on free and handed out again for
// the same size (page-rounded), up to the peak of live bytes (allocator.cpp says why).
Allocator& cpu_allocator();
size_t cpu_allocator_cached_bytes();  // what the CPU allocator holds freed, for tests

}  // namespace autosp
