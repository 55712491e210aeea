// The device runtime on a GPU: the caching allocator over cudaMalloc (reuse, peak, reserved, the
// out-of-memory message and recovery), copies between host and device for every dtype, and the
// executor's peak taken from the device allocator.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstring>
#include <thread>

#include "common/naive.h"
#include "cuda/dispatch_test.h"
#include "graph/builder.h"
#include "device/local_rank.h"
#include "device/stream_slot.h"

using namespace autosp;
using namespace autosp::cudatest;

TEST_CASE("the CUDA caching allocator reuses freed blocks and tracks live, peak and reserved bytes", "[device]") {
  CachingAllocator& a = cuda_allocator(0);
  CHECK(a.device() == kGpu);
  synchronize();
  a.empty_cache();
  const size_t live0 = a.live_bytes(), reserved0 = a.reserved_bytes();
  a.reset_peak();
  void* p = nullptr;
  {
    Tensor t = Tensor::empty({1000}, DType::f32, a);  // 4000 bytes: the small pool
    p = t.raw();
    CHECK(a.live_bytes() == live0 + 4000);
    CHECK(a.reserved_bytes() == reserved0 + CachingAllocator::kSmallSegment);
  }
  CHECK(a.live_bytes() == live0);
  {
    Tensor again = Tensor::empty({1000}, DType::f32, a);
    CHECK(again.raw() == p);  // the cached block, no new cudaMalloc
    CHECK(a.reserved_bytes() == reserved0 + CachingAllocator::kSmallSegment);
    Tensor big = Tensor::empty({3 << 20}, DType::f32, a);  // 12 MiB: a large segment
    CHECK(a.reserved_bytes() == reserved0 + CachingAllocator::kSmallSegment + (12u << 20));
    CHECK(a.peak_bytes() == live0 + 4000 + (12u << 20));
  }
  CHECK(a.cached_bytes() >= CachingAllocator::kSmallSegment + (12u << 20));
  a.empty_cache();
  CHECK(a.reserved_bytes() == reserved0);
}

TEST_CASE("out of device memory: RuntimeFailure naming the bytes, and the device keeps working", "[device]") {
  CachingAllocator& a = cuda_allocator(0);
  size_t free_b = 0, total_b = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  const size_t too_much = total_b * 2;
  try {
    a.allocate(too_much);
    FAIL("allocating twice the device memory succeeded");
  } catch (const RuntimeFailure& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("CUDA out of memory on cuda:0") != std::string::npos);
    CHECK(msg.find("requested " + std::to_string(too_much) + " bytes") != std::string::npos);
    CHECK(msg.find("bytes live in tensors") != std::string::npos);
    CHECK(msg.find("bytes cached") != std::string::npos);
  }
  // The failed cudaMalloc left no sticky error: copies and kernels still run.
  const Tensor h = Tensor::from_vector<float>({4}, {1, 2, 3, 4});
  CHECK(down(up(h)).to_doubles() == std::vector<double>{1, 2, 3, 4});
  Graph g;
  Builder b(g);
  g.add_output(b.neg(b.input("x", DType::f32, {4}, Role::none)));
  const RunResult r = Executor(g).run({{"x", up(h)}});
  CHECK(down(r.outputs.begin()->second).to_doubles() == std::vector<double>{-1, -2, -3, -4});
}

// Thread ranks on one GPU: slot 1 caches 60% of the free memory; slot 2 then asks for as much,
// which fits only once slot 1's cache and the stream-ordered pool are given back (the reclaim of
// device/cuda/device.cpp). Each slot's thread stays in its slot, as a thread rank does.
TEST_CASE("out of device memory in one stream slot frees the other slots' caches", "[device]") {
  size_t free_b = 0, total_b = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  const size_t big = free_b / 10 * 6 / CachingAllocator::kLargeRound * CachingAllocator::kLargeRound;
  size_t cached_in_one = 0, reserved_in_one_after = 1;
  std::thread([&] {
    StreamSlotScope in(1);
    CachingAllocator& one = cuda_allocator(0);
    one.deallocate(one.allocate(big), big);  // now cached by slot 1
    cached_in_one = one.cached_bytes();
  }).join();
  bool fitted = false;
  std::thread([&] {
    StreamSlotScope in(2);
    CachingAllocator& two = cuda_allocator(0);
    void* p = two.allocate(big);
    fitted = p != nullptr;
    two.deallocate(p, big);
    two.empty_cache();
  }).join();
  std::thread([&] {
    StreamSlotScope in(1);
    reserved_in_one_after = cuda_allocator(0).reserved_bytes();
  }).join();
  CHECK(cached_in_one >= big);
  CHECK(fitted);
  CHECK(reserved_in_one_after == 0);
}

TEST_CASE("host <-> device copies keep every dtype's bits", "[device]") {
  const Tensor f32 = Tensor::from_vector({2, 3}, naive::random_normal(6, 1));
  const std::vector<Tensor> hosts = {f32.to(DType::f32), f32.to(DType::f64), f32.to(DType::bf16),
                                     Tensor::from_vector<int32_t>({3}, {-7, 0, 1 << 30}),
                                     Tensor::from_vector<int64_t>({2}, {-1, int64_t(1) << 40}),
                                     Tensor::from_vector<float>({}, {2.5f})};
  for (const Tensor& h : hosts) {
    INFO(h.str());
    const Tensor d = up(h);
    CHECK(d.device() == kGpu);
    CHECK(d.dtype() == h.dtype());
    CHECK(d.shape() == h.shape());
    const Tensor d2 = to_device(d, kGpu);  // device → device copy
    CHECK(d2.raw() != d.raw());
    const Tensor back = down(d2);
    CHECK(back.device() == Device{});
    REQUIRE(back.nbytes() == h.nbytes());
    CHECK(std::memcmp(back.raw(), h.raw(), h.nbytes()) == 0);
  }
}

TEST_CASE("the executor's peak on CUDA is the device allocator's high-water mark", "[device]") {
  // x [S, 1024] → 6 chained negations (as tests/engine/test_op_cases.cpp on the CPU).
  Graph g;
  Builder b(g);
  Node* x = b.input("x", DType::f64, {Dim::sym("S"), 1024}, Role::none);
  Node* y = x;
  for (int i = 0; i < 6; ++i) y = b.neg(y);
  g.add_output(y);
  const Tensor in = up(Tensor::zeros({64, 1024}, DType::f64));
  Executor ex(g);
  const size_t others = cuda_allocator(0).live_bytes() - in.nbytes();  // tensors of no concern here
  const RunResult r = ex.run({{"x", in}});
  // The input, the planned arena (the negations run in place in it) and the output, which
  // outlives the run and so is not in the arena.
  CHECK(r.planned_bytes >= in.nbytes());
  CHECK(r.peak_bytes - others >= in.nbytes() + r.planned_bytes);
  CHECK(r.peak_bytes - others <= 2 * in.nbytes() + r.planned_bytes);
  CHECK(r.peak_bytes == cuda_allocator(0).peak_bytes());
  CHECK(r.outputs.begin()->second.device() == kGpu);
}

TEST_CASE("this process's device is picked from its local rank", "[device]") {
  const int d = select_device_for_local_rank();
  CHECK(d == local_rank_from_env());
  CHECK(d < cuda_device_count());
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  CHECK(current == d);
}
