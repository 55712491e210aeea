// The CUDA caching allocator's bookkeeping (src/device/cuda/caching_allocator.h) over fake device
// memory: host buffers from a counting, capped malloc. The GPU suite (tests/cuda/test_device.cpp)
// repeats the essentials over cudaMalloc.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <set>

#include "device/cuda/caching_allocator.h"

using namespace autosp;

namespace {

// Fake device memory: at most `cap` bytes in segments; counts the calls.
struct FakeDevice {
  size_t cap = size_t(1) << 40, used = 0;
  int mallocs = 0, frees = 0, failures = 0;
  std::map<void*, size_t> live;

  RawMemory raw() {
    return {[this](size_t n) -> void* {
              if (used + n > cap) {
                ++failures;
                return nullptr;
              }
              void* p = std::malloc(n);
              REQUIRE(p != nullptr);
              used += n;
              live[p] = n;
              ++mallocs;
              return p;
            },
            [this](void* p) {
              auto it = live.find(p);
              REQUIRE(it != live.end());
              used -= it->second;
              live.erase(it);
              std::free(p);
              ++frees;
            }};
  }
};

constexpr size_t kMiB = size_t(1) << 20;
const Device kDev{DeviceKind::cuda, 0};

}  // namespace

TEST_CASE("caching allocator rounds sizes to 512 bytes", "[caching_allocator]") {
  CHECK(CachingAllocator::round_size(0) == 512);
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::round_size(3 * kMiB + 1) == 3 * kMiB + 512);
}

TEST_CASE("small blocks share a 2 MiB segment and are reused after free", "[caching_allocator]") {
  FakeDevice dev;
  CachingAllocator a(kDev, dev.raw());
  CHECK(a.device() == kDev);
  char* p = static_cast<char*>(a.allocate(100));
  char* q = static_cast<char*>(a.allocate(1000));
  CHECK(dev.mallocs == 1);  // one segment serves both
  CHECK(a.reserved_bytes() == 2 * kMiB);
  CHECK(q == p + 512);  // the rest of the segment, split after the first 512-byte block
  CHECK(a.live_bytes() == 1100);
  a.deallocate(p, 100);
  CHECK(a.live_bytes() == 1000);
  void* r = a.allocate(300);  // best fit: the freed 512-byte block
  CHECK(r == p);
  CHECK(dev.mallocs == 1);
  a.deallocate(r, 300);
  a.deallocate(q, 1000);
  CHECK(a.live_bytes() == 0);
  CHECK(a.cached_bytes() == 2 * kMiB);  // kept for reuse, not returned
  CHECK(dev.frees == 0);
  // Freed neighbours merged back into one block: a request for the whole segment fits in it.
  void* whole = a.allocate(kMiB);
  CHECK(whole == p);
  CHECK(dev.mallocs == 1);
  a.deallocate(whole, kMiB);
}

TEST_CASE("large blocks: 2 MiB-rounded segments, best fit among free blocks", "[caching_allocator]") {
  FakeDevice dev;
  CachingAllocator a(kDev, dev.raw());
  void* big = a.allocate(10 * kMiB + 7);
  void* mid = a.allocate(3 * kMiB);
  CHECK(dev.mallocs == 2);
  CHECK(a.reserved_bytes() == 10 * kMiB + 2 * kMiB + 4 * kMiB);  // 12 MiB and 4 MiB segments
  a.deallocate(big, 10 * kMiB + 7);
  a.deallocate(mid, 3 * kMiB);
  // 3 MiB fits both free segments (12 and 4 MiB): best fit takes the 4 MiB one.
  void* again = a.allocate(3 * kMiB - 100);
  CHECK(again == mid);
  // 5 MiB only fits the 12 MiB segment, which is split (no new segment).
  void* split = a.allocate(5 * kMiB);
  CHECK(split == big);
  CHECK(dev.mallocs == 2);
  void* rest = a.allocate(6 * kMiB);  // the 7 MiB remainder of the split
  CHECK(rest == static_cast<char*>(big) + 5 * kMiB);
  CHECK(dev.mallocs == 2);
  a.deallocate(again, 3 * kMiB - 100);
  a.deallocate(split, 5 * kMiB);
  a.deallocate(rest, 6 * kMiB);
  CHECK(a.live_bytes() == 0);
}

TEST_CASE("small and large requests never share a segment", "[caching_allocator]") {
  FakeDevice dev;
  CachingAllocator a(kDev, dev.raw());
  void* large = a.allocate(4 * kMiB);
  a.deallocate(large, 4 * kMiB);
  void* small = a.allocate(4096);  // the free 4 MiB block is in the large pool
  CHECK(small != large);
  CHECK(dev.mallocs == 2);
  a.deallocate(small, 4096);
}

TEST_CASE("peak is the high-water mark of bytes handed out", "[caching_allocator]") {
  FakeDevice dev;
  CachingAllocator a(kDev, dev.raw());
  void* x = a.allocate(3000);
  void* y = a.allocate(5000);
  a.deallocate(x, 3000);
  void* z = a.allocate(1000);
  CHECK(a.live_bytes() == 6000);
  CHECK(a.peak_bytes() == 8000);
  a.reset_peak();
  CHECK(a.peak_bytes() == 6000);
  a.deallocate(y, 5000);
  a.deallocate(z, 1000);
  CHECK(a.peak_bytes() == 6000);
  CHECK(a.live_bytes() == 0);
}

TEST_CASE("empty_cache returns wholly free segments only", "[caching_allocator]") {
  FakeDevice dev;
  CachingAllocator a(kDev, dev.raw());
  void* keep = a.allocate(1000);      // small segment, stays in use
  void* gone = a.allocate(8 * kMiB);  // large segment, freed
  a.deallocate(gone, 8 * kMiB);
  CHECK(a.segments() == 2);
  a.empty_cache();
  CHECK(dev.frees == 1);
  CHECK(a.segments() == 1);
  CHECK(a.reserved_bytes() == 2 * kMiB);
  CHECK(dev.live.size() == 1);
  a.deallocate(keep, 1000);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
  CHECK(dev.live.empty());
}

TEST_CASE("out of memory: the cache is released and the request retried once", "[caching_allocator]") {
  FakeDevice dev;
  dev.cap = 10 * kMiB;
  CachingAllocator a(kDev, dev.raw());
  void* x = a.allocate(6 * kMiB);
  a.deallocate(x, 6 * kMiB);  // cached: 6 MiB of the 10
  void* y = a.allocate(8 * kMiB);  // misses (8 > 6), fails (6 + 8 > 10), releases, retries
  CHECK(y != nullptr);
  CHECK(dev.failures == 1);
  CHECK(dev.frees == 1);
  CHECK(a.reserved_bytes() == 8 * kMiB);
  CHECK(a.live_bytes() == 8 * kMiB);

  // Nothing cached can help now: RuntimeFailure naming requested, live and cached bytes.
  void* small = a.allocate(1000);  // 2 MiB segment: 10 MiB in use
  a.deallocate(small, 1000);       // 2 MiB cached
  try {
    a.allocate(4 * kMiB);
    FAIL("expected an out-of-memory failure");
  } catch (const RuntimeFailure& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("CUDA out of memory on cuda:0") != std::string::npos);
    CHECK(msg.find("requested 4194304 bytes") != std::string::npos);
    CHECK(msg.find("8388608 bytes live") != std::string::npos);
    CHECK(msg.find("2097152 bytes cached") != std::string::npos);
  }
  CHECK(dev.failures == 3);          // the first try and the retry
  CHECK(a.reserved_bytes() == 8 * kMiB);  // the free small segment was released before the retry
  CHECK(a.live_bytes() == 8 * kMiB);      // the failure changed nothing live
  a.deallocate(y, 8 * kMiB);
}

// Thread ranks on one GPU: each stream slot has its own allocator over the same device memory. An
// out-of-memory in one must free what the others cache (the device runtime's reclaim empties
// every slot's cache and trims the stream-ordered pool); without it slot 1's cached 6 MiB starve
// slot 2. The reclaim runs without the failing allocator's lock (it empties that one too here).
TEST_CASE("out of memory: reclaim frees the other allocators' caches before the last retry", "[caching_allocator]") {
  FakeDevice dev;
  dev.cap = 10 * kMiB;
  int reclaims = 0;
  CachingAllocator* slots[2] = {nullptr, nullptr};
  RawMemory shared = dev.raw();
  shared.reclaim = [&] {
    ++reclaims;
    for (CachingAllocator* s : slots) s->empty_cache();  // the failing one included: no deadlock
  };
  CachingAllocator one(kDev, shared), two(kDev, shared);
  slots[0] = &one;
  slots[1] = &two;
  void* x = one.allocate(6 * kMiB);
  one.deallocate(x, 6 * kMiB);  // cached by slot 1: 6 MiB of the 10
  void* y = two.allocate(8 * kMiB);  // slot 2: fails, has nothing to release, reclaims, retries
  CHECK(y != nullptr);
  CHECK(reclaims == 1);
  CHECK(dev.failures == 2);
  CHECK(one.reserved_bytes() == 0);
  CHECK(two.live_bytes() == 8 * kMiB);

  // Without a reclaim the same request fails, and says what it released.
  FakeDevice dev2;
  dev2.cap = 10 * kMiB;
  CachingAllocator three(kDev, dev2.raw()), four(kDev, dev2.raw());
  void* z = three.allocate(6 * kMiB);
  three.deallocate(z, 6 * kMiB);
  CHECK_THROWS_WITH(four.allocate(8 * kMiB), Catch::Contains("CUDA out of memory") && !Catch::Contains("other caches"));
  two.deallocate(y, 8 * kMiB);
}

TEST_CASE("freeing a pointer the allocator did not hand out is caught", "[caching_allocator]") {
  FakeDevice dev;
  CachingAllocator a(kDev, dev.raw());
  int local = 0;
  CHECK_THROWS_WITH(a.deallocate(&local, 4), Catch::Contains("did not hand out"));
  void* p = a.allocate(64);
  CHECK_THROWS_WITH(a.deallocate(p, 65), Catch::Contains("allocated with 64"));
  a.deallocate(p, 64);
  CHECK_THROWS(a.deallocate(p, 64));  // twice
}

TEST_CASE("tensors over the caching allocator: many sizes, no overlap, all memory back", "[caching_allocator]") {
  FakeDevice dev;
  {
    CachingAllocator a(kDev, dev.raw());
    std::vector<std::pair<char*, size_t>> live;
    uint64_t seed = 12345;
    auto next = [&] {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      return seed >> 33;
    };
    for (int step = 0; step < 2000; ++step) {
      if (live.empty() || (live.size() < 64 && next() % 2 == 0)) {
        const size_t n = next() % 4 != 0 ? next() % 5000 : next() % (6 * kMiB);
        char* p = static_cast<char*>(a.allocate(n));
        for (const auto& [q, m] : live) {  // no two live blocks overlap
          const bool apart = p + CachingAllocator::round_size(n) <= q || q + CachingAllocator::round_size(m) <= p;
          REQUIRE(apart);
        }
        live.emplace_back(p, n);
      } else {
        const size_t i = next() % live.size();
        a.deallocate(live[i].first, live[i].second);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    size_t want = 0;
    for (const auto& [p, n] : live) want += n;
    CHECK(a.live_bytes() == want);
    for (const auto& [p, n] : live) a.deallocate(p, n);
    CHECK(a.live_bytes() == 0);
    CHECK(a.cached_bytes() == a.reserved_bytes());
  }
  CHECK(dev.live.empty());  // the destructor returned every segment
  CHECK(dev.frees == dev.mallocs);
}
