// Tensor conversions: to(dtype) rounds each value once to the target dtype, whatever the source.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/tensor.h"

namespace autosp {
namespace {

TEST_CASE("Tensor::to(bf16) from f64 rounds once, not through f32", "[tensor]") {
  // 1 + 2^-8 + 2^-30 lies just above the midpoint of bf16's 1 and 1 + 2^-7: rounded once it goes up.
  // Through f32 it would first become exactly the midpoint (2^-30 is below f32's ulp at 1), which
  // ties to even: down to 1.
  const double x = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  const Tensor t = Tensor::from_vector<double>({3}, {x, -x, 1.0 + std::ldexp(1.0, -8)});
  const std::vector<double> got = t.to(DType::bf16).to_doubles();
  CHECK(got[0] == 1.0 + std::ldexp(1.0, -7));
  CHECK(got[1] == -(1.0 + std::ldexp(1.0, -7)));
  CHECK(got[2] == 1.0);  // an exact tie goes to even
  // f32 sources are unchanged by the fix: the same values as before, exactly representable.
  const Tensor f = Tensor::from_vector<float>({2}, {1.5f, 3.0f});
  CHECK(f.to(DType::bf16).to_doubles() == std::vector<double>{1.5, 3.0});
}

}  // namespace
}  // namespace autosp

// The CPU allocator's cache of large blocks (tensor/allocator.cpp): a freed block of 1 MiB or more
// comes back for the same page-rounded size, writable to its end and page-aligned; a small block is
// never cached; the accounting counts what is handed out, not what is cached; and the cache never
// holds more than the peak of live bytes. (Under AddressSanitizer nothing is cached: skipped.)
TEST_CASE("the CPU allocator hands a freed large block out again for the same size", "[tensor]") {
#if defined(__SANITIZE_ADDRESS__)
  WARN("SKIPPED: the allocator caches nothing under AddressSanitizer");
#else
  using autosp::cpu_allocator;
  using autosp::cpu_allocator_cached_bytes;
  autosp::Allocator& a = cpu_allocator();
  const size_t big = (size_t(3) << 20) + 100;  // rounds to 3 MiB + a page
  void* raise = a.allocate(size_t(16) << 20);  // live throughout: a peak the blocks below fit under
  void* p = a.allocate(big);
  CHECK(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
  static_cast<char*>(p)[big - 1] = 1;
  const size_t live = a.live_bytes(), cached = cpu_allocator_cached_bytes();
  a.deallocate(p, big);
  CHECK(a.live_bytes() == live - big);
  CHECK(cpu_allocator_cached_bytes() == cached + (size_t(3) << 20) + 4096);
  void* q = a.allocate(big - 50);  // the same rounded size
  CHECK(q == p);
  CHECK(cpu_allocator_cached_bytes() == cached);
  CHECK(a.live_bytes() == live - 50);
  a.deallocate(q, big - 50);
  // Another rounded size does not take it.
  void* r = a.allocate(size_t(5) << 20);
  CHECK(r != p);
  a.deallocate(r, size_t(5) << 20);
  // Small blocks are not cached.
  const size_t before = cpu_allocator_cached_bytes();
  void* s = a.allocate(4096);
  a.deallocate(s, 4096);
  CHECK(cpu_allocator_cached_bytes() == before);
  // Six 2 MiB blocks and `raise` freed: what fits under the peak of live bytes is kept, never more.
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(a.allocate(size_t(2) << 20));
  for (void* b : blocks) a.deallocate(b, size_t(2) << 20);
  a.deallocate(raise, size_t(16) << 20);
  CHECK(cpu_allocator_cached_bytes() <= a.peak_bytes());
  CHECK(cpu_allocator_cached_bytes() > before);
#endif
}
