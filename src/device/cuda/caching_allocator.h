// The caching allocator behind every CUDA tensor (one per device, PyTorch-like): sizes are rounded
// up (512 B granularity), memory is taken from the device in segments (2 MiB for requests up to
// 1 MiB, else the request rounded up to 2 MiB), a segment is split into blocks, freed blocks go back
// to size-ordered free lists (small and large pool) and are reused best-fit, merging with free
// neighbours of the same segment. The device is asked for memory only on a miss; when it has none,
// every wholly free segment is returned and the request retried; if the device still has none,
// RawMemory::reclaim (when set) frees what else on the device holds memory unused — the other
// stream slots' allocators, the stream-ordered pool — and the request is retried once more, then
// RuntimeFailure names the requested, live and cached bytes.
//
// Reuse needs no events: every kernel of a device runs on its one compute stream, so work that
// reads a freed block was enqueued before any work that writes the block's next owner.
//
// The raw device calls are parameters (RawMemory), so this file has no CUDA header and the
// bookkeeping is unit-tested on the CPU (tests/device/test_caching_allocator.cpp). It is
// header-only because src/device/cuda/*.cpp is compiled only in CUDA builds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "tensor/allocator.h"
#include "tensor/check.h"

namespace autosp {

// How the allocator gets and returns device memory. `allocate` returns nullptr when the device is
// out of memory (and throws for any other failure); `release` returns a whole segment. `reclaim`
// (optional) is called, without this allocator's lock held, when the device is out of memory even
// after this allocator returned its own cache: it returns the memory other owners on the device
// hold unused (it may call empty_cache() of any allocator, this one included).
struct RawMemory {
  std::function<void*(size_t)> allocate;
  std::function<void(void*)> release;
  std::function<void()> reclaim = {};
};

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kRound = 512;              // every block is a multiple of this
  static constexpr size_t kSmallRequest = 1u << 20;  // requests up to this come from the small pool
  static constexpr size_t kSmallSegment = 2u << 20;  // the small pool's segment size
  static constexpr size_t kLargeRound = 2u << 20;    // large segments are multiples of this

  CachingAllocator(Device device, RawMemory raw) : device_(device), raw_(std::move(raw)) {}
  ~CachingAllocator() override {
    // Process exit: the driver may already be gone, so failures to release are ignored.
    for (auto& [ptr, b] : blocks_) {
      if (b->prev != nullptr) continue;  // not the first block of its segment
      try {
        raw_.release(b->ptr);
      } catch (...) {
      }
    }
  }
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  static size_t round_size(size_t nbytes) { return nbytes == 0 ? kRound : (nbytes + kRound - 1) / kRound * kRound; }

  void* allocate(size_t nbytes) override {
    std::unique_lock<std::mutex> lock(mu_);
    const size_t size = round_size(nbytes);
    const bool small = size <= kSmallRequest;
    Block* b = take_free(small, size);
    if (b == nullptr) b = new_segment(small, size, nbytes, lock);
    split(b, size);
    b->allocated = true;
    b->requested = nbytes;
    allocated_ += b->size;
    note_alloc(nbytes);
    return b->ptr;
  }

  void deallocate(void* p, size_t nbytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    AUTOSP_ASSERT(it != blocks_.end() && it->second->allocated, "free of ", p, " which ", device_.str(),
                  "'s allocator did not hand out");
    Block* b = it->second.get();
    AUTOSP_ASSERT(b->requested == nbytes, "free of ", nbytes, " bytes at ", p, ", allocated with ", b->requested);
    b->allocated = false;
    allocated_ -= b->size;
    note_free(nbytes);
    if (b->prev && !b->prev->allocated) b = merge(b->prev, b);
    if (b->next && !b->next->allocated) b = merge(b, b->next);
    pool(b->small).insert(b);
  }

  Device device() const override { return device_; }

  // Bytes held from the device (all segments), and the part of them in no live block.
  size_t reserved_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reserved_;
  }
  size_t cached_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reserved_ - allocated_;
  }
  size_t segments() const {
    std::lock_guard<std::mutex> lock(mu_);
    return segments_;
  }

  // Return every wholly free segment to the device.
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    release_free_segments();
  }

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours inside the segment (null at its ends)
    Block* next = nullptr;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return std::tie(a->size, a->ptr) < std::tie(b->size, b->ptr);
    }
  };
  using Pool = std::set<Block*, BySize>;

  Pool& pool(bool small) { return small ? small_ : large_; }

  // The smallest free block of the pool that holds `size` (best fit), removed from the pool.
  Block* take_free(bool small, size_t size) {
    Pool& p = pool(small);
    Block key;
    key.size = size;
    auto it = p.lower_bound(&key);
    if (it == p.end()) return nullptr;
    Block* b = *it;
    p.erase(it);
    return b;
  }

  // A new segment for a request of `size` (rounded) bytes. `lock` holds mu_; it is released while
  // RawMemory::reclaim runs.
  Block* new_segment(bool small, size_t size, size_t requested, std::unique_lock<std::mutex>& lock) {
    const size_t seg = small ? kSmallSegment : (size + kLargeRound - 1) / kLargeRound * kLargeRound;
    void* p = raw_.allocate(seg);
    const size_t cached = reserved_ - allocated_;
    if (p == nullptr) {  // out of memory: give the cache back to the device and try again
      release_free_segments();
      p = raw_.allocate(seg);
    }
    if (p == nullptr && raw_.reclaim) {  // then what the device's other owners hold unused
      lock.unlock();
      raw_.reclaim();
      lock.lock();
      p = raw_.allocate(seg);
    }
    if (p == nullptr)
      throw RuntimeFailure(str("CUDA out of memory on ", device_.str(), ": requested ", requested,
                               " bytes (a segment of ", seg, "), with ", live_bytes(), " bytes live in tensors and ",
                               cached, " bytes cached (released and retried", raw_.reclaim ? ", with the device's other caches" : "",
                               "; ", reserved_, " bytes still reserved). Reduce data.batch_size or data.seq_len, or set "
                               "runtime.activation_checkpointing"));
    auto owned = std::make_unique<Block>();
    Block* b = owned.get();
    b->ptr = static_cast<char*>(p);
    b->size = seg;
    b->small = small;
    blocks_.emplace(p, std::move(owned));
    reserved_ += seg;
    ++segments_;
    return b;
  }

  // Cut the free block `b` to `size`; the rest becomes a free block of the same pool when it is
  // worth keeping (a small remainder of a large block stays part of it, as in PyTorch).
  void split(Block* b, size_t size) {
    const size_t rest = b->size - size;
    if (rest < (b->small ? kRound : kSmallRequest + 1)) return;
    auto owned = std::make_unique<Block>();
    Block* r = owned.get();
    r->ptr = b->ptr + size;
    r->size = rest;
    r->small = b->small;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    blocks_.emplace(r->ptr, std::move(owned));
    pool(r->small).insert(r);
  }

  // Merge free neighbours a (first) and b into a; whichever of them sits in a free list leaves it.
  Block* merge(Block* a, Block* b) {
    pool(a->small).erase(a);
    pool(b->small).erase(b);
    a->size += b->size;
    a->next = b->next;
    if (b->next) b->next->prev = a;
    blocks_.erase(b->ptr);
    return a;
  }

  void release_free_segments() {
    for (Pool* p : {&small_, &large_}) {
      for (auto it = p->begin(); it != p->end();) {
        Block* b = *it;
        if (b->prev == nullptr && b->next == nullptr) {  // a whole segment, free
          it = p->erase(it);
          raw_.release(b->ptr);
          reserved_ -= b->size;
          --segments_;
          blocks_.erase(b->ptr);
        } else {
          ++it;
        }
      }
    }
  }

  const Device device_;
  const RawMemory raw_;
  mutable std::mutex mu_;
  std::unordered_map<void*, std::unique_ptr<Block>> blocks_;  // every block by its address
  Pool small_, large_;                                       // free blocks
  size_t reserved_ = 0, allocated_ = 0, segments_ = 0;        // bytes in segments / in live blocks
};

}  // namespace autosp
