// A CPU emulation of the few CUDA features our kernels use, so their logic (tiling, masking,
// reductions, online softmax, tensor-core fragment layouts) and their launchers are tested by CI on
// machines without a GPU. Include this, then one kernel source (`src/kernels/cuda/norm.cu`, …), in
// a host translation unit: AUTOSP_CUDA_EMULATION makes common.cuh's device helpers compile for the
// host and launch_kernel run the kernel here; the CUDA runtime calls the launchers make (memcpy,
// memset, attributes) are redirected below, and Scratch is malloc (emulation.cpp). Memory is host
// memory: pass host pointers to the launchers.
//
// A block's threads are fibers (ucontext) on the calling thread: a fiber runs until it reaches a
// barrier (__syncthreads, or the warp barriers inside shuffles, votes and mma), and each pass of
// the scheduler resumes the live fibers in a fresh random order, so a kernel that relies on one
// thread running before another between barriers fails here too (seeded: AUTOSP_EMULATION_SEED
// reproduces a run). `__shared__` becomes `static` (blocks run one at a time). Shared memory is
// filled with NaN bytes (0xff: NaN as f32, f64 and bf16) before every block, so a read of shared
// memory the block did not write shows: the dynamic shared memory of the tensor-core kernels
// (`autosp::cuda::attention_smem`, placed in the section autosp_emu_dynamic_shared) and the static
// `__shared__` arrays of the launched kernel, which emulation.cpp finds in this executable's
// symbol table (a kernel's static locals are the objects named `_ZZ<its mangled name>E...`). A
// launch is refused as the hardware refuses it: more than 1024 threads per block (or block.z > 64,
// grid.y/z > 65535), more than 48 KiB of static shared memory, more dynamic shared memory than
// sm_90 has. The mma.sync.m16n8k16 (bf16 → f32) is computed from the operand registers
// of the 32 lanes with the fragment layouts of the PTX ISA, written out here independently of the
// kernel's own helpers.
//
// What it cannot catch: anything about real hardware — timing, bank conflicts, register limits,
// a wrong belief about the PTX layouts shared by both sides; and ordering within a warp between
// barriers (fibers switch only at barriers, so a warp never runs its lanes interleaved).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <ucontext.h>
#include <vector_functions.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#define AUTOSP_CUDA_EMULATION 1
#define __launch_bounds__(...)
#undef __shared__
#define __shared__ static
// Where the linker puts the dynamic shared memory (weak: a binary without it gets nullptr).
extern "C" {
extern unsigned char __start_autosp_emu_dynamic_shared[] __attribute__((weak));
extern unsigned char __stop_autosp_emu_dynamic_shared[] __attribute__((weak));
}

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {

struct Barrier {
  int participants = 0, arrived = 0;
  uint64_t generation = 0;
};

struct Fiber {
  ucontext_t ctx{};
  std::unique_ptr<unsigned char[]> stack;  // left uninitialised: zeroing 64 KiB per thread per launch was most of a launch's time
  size_t stack_bytes = 0;
  unsigned tid = 0;  // linear thread index in the block
  bool done = false;
};

struct Warp {
  Barrier bar;
  unsigned char buf[32][8] = {};  // shuffles and votes
  uint32_t a[32][4] = {}, b[32][2] = {};
  float c[32][4] = {};
};

struct Block {
  std::vector<Warp> warps;
  Barrier bar;
  ucontext_t scheduler{};
  Fiber* current = nullptr;
  std::function<void()> body;
};

inline Block* g_block = nullptr;

// The hardware's limits on a launch (sm_90).
inline constexpr unsigned kMaxThreadsPerBlock = 1024, kMaxBlockZ = 64;
inline constexpr size_t kMaxDynamicShared = 227 * 1024, kMaxStaticShared = 48 * 1024;

// A static `__shared__` array of a kernel (a static local in emulation).
struct StaticShared {
  unsigned char* at = nullptr;
  size_t bytes = 0;
};
// Those of the kernel function at `kernel` (emulation.cpp: from /proc/self/exe's symbol table;
// cached per kernel). Empty for nullptr.
const std::vector<StaticShared>& static_shared_of(const void* kernel);

// The scheduler's random order: AUTOSP_EMULATION_SEED, else a fixed default (runs repeat).
inline std::mt19937_64& order_rng() {
  static std::mt19937_64 rng([] {
    const char* s = std::getenv("AUTOSP_EMULATION_SEED");
    return s && *s ? std::strtoull(s, nullptr, 10) : uint64_t{20240520};
  }());
  return rng;
}

inline size_t section_bytes(const unsigned char* start, const unsigned char* stop) {
  return start && stop ? size_t(stop - start) : 0;
}

// Refuses what a real launch would refuse, naming the limit.
inline void check_launch(dim3 grid, dim3 block, size_t dynamic_smem, const std::vector<StaticShared>& statics) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  auto fail = [](const std::string& why) { throw std::runtime_error("emulated launch refused: " + why); };
  if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) fail("an empty grid or block");
  if (threads > kMaxThreadsPerBlock)
    fail(std::to_string(threads) + " threads per block (at most " + std::to_string(kMaxThreadsPerBlock) + ")");
  if (block.z > kMaxBlockZ) fail("block.z " + std::to_string(block.z) + " (at most 64)");
  if (grid.y > 65535 || grid.z > 65535) fail("grid.y or grid.z over 65535");
  size_t static_bytes = 0;
  for (const StaticShared& s : statics) static_bytes += s.bytes;
  if (static_bytes > kMaxStaticShared)
    fail(std::to_string(static_bytes) + " bytes of static shared memory (at most 48 KiB)");
  if (dynamic_smem > kMaxDynamicShared)
    fail(std::to_string(dynamic_smem) + " bytes of dynamic shared memory (at most 227 KiB on sm_90)");
  const size_t dyn = section_bytes(__start_autosp_emu_dynamic_shared, __stop_autosp_emu_dynamic_shared);
  if (dynamic_smem > dyn && dynamic_smem > 0)
    fail(std::to_string(dynamic_smem) + " bytes of dynamic shared memory, more than the emulation's " +
         std::to_string(dyn));
}

// Shared memory a block has not written reads as NaN.
inline void poison_shared(const std::vector<StaticShared>& statics) {
  if (const size_t n = section_bytes(__start_autosp_emu_dynamic_shared, __stop_autosp_emu_dynamic_shared))
    std::memset(__start_autosp_emu_dynamic_shared, 0xff, n);
  for (const StaticShared& s : statics) std::memset(s.at, 0xff, s.bytes);
}
inline uint64_t g_progress = 0;  // barrier arrivals and finished fibers: a pass without any is a deadlock

inline void yield() {
  Fiber* f = g_block->current;
  swapcontext(&f->ctx, &g_block->scheduler);
}

inline void wait(Barrier& b) {
  const uint64_t gen = b.generation;
  ++g_progress;
  if (++b.arrived == b.participants) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  while (b.generation == gen) yield();
}

inline Warp& my_warp() { return g_block->warps[g_block->current->tid / 32]; }
inline unsigned my_lane() { return g_block->current->tid % 32; }

// The value `v` of lane `src` of this warp (every lane of the warp must call it).
template <class V>
V exchange(V v, unsigned src) {
  static_assert(sizeof(V) <= 8);
  Warp& w = my_warp();
  std::memcpy(w.buf[my_lane()], &v, sizeof(V));
  wait(w.bar);
  V r;
  std::memcpy(&r, w.buf[src % 32], sizeof(V));
  wait(w.bar);
  return r;
}

inline void trampoline() {
  Fiber* f = g_block->current;
  g_block->body();
  f->done = true;
  ++g_progress;
  swapcontext(&f->ctx, &g_block->scheduler);
}

// Makes f start at trampoline() when it is first switched to. (Its own function: getcontext
// "returns twice" for the compiler, which would otherwise worry about the caller's variables.)
[[gnu::noinline]] inline void start_fiber(Fiber& f) {
  f.done = false;
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.get();
  f.ctx.uc_stack.ss_size = f.stack_bytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, trampoline, 0);
}

// Runs body() as every thread of every block of `grid` (blocks of block.x × block.y threads);
// `kernel` is the kernel function (its static shared arrays are poisoned and counted), or nullptr.
// Launches from several host threads (ranks as threads: tests/cuda/emulate_moe.cpp's expert
// parallelism) run one at a time, as the emulation's state (threadIdx, the block, the static
// shared arrays) is global.
inline void launch(dim3 grid, dim3 block, size_t dynamic_smem, const void* kernel, const std::function<void()>& body) {
  static std::mutex one_at_a_time;
  const std::lock_guard<std::mutex> hold(one_at_a_time);
  constexpr size_t kStack = 64 * 1024;
  const std::vector<StaticShared>& statics = static_shared_of(kernel);
  check_launch(grid, block, dynamic_smem, statics);
  const unsigned threads = block.x * block.y * block.z;
  std::vector<size_t> order(threads);
  gridDim = grid;
  blockDim = block;
  std::vector<std::unique_ptr<Fiber>> fibers(threads);  // reused by every block
  for (unsigned t = 0; t < threads; ++t) {
    fibers[t] = std::make_unique<Fiber>();
    fibers[t]->tid = t;
    fibers[t]->stack.reset(new unsigned char[kStack]);
    fibers[t]->stack_bytes = kStack;
  }
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block blk;
        blk.body = body;
        blk.bar.participants = int(threads);
        blk.warps.resize((threads + 31) / 32);
        for (Warp& w : blk.warps) w.bar.participants = 32;
        g_block = &blk;
        blockIdx = uint3{bx, by, bz};
        for (auto& f : fibers) start_fiber(*f);
        poison_shared(statics);
        for (bool running = true; running;) {  // passes in random order until every fiber has returned
          running = false;
          const uint64_t progress = g_progress;
          for (size_t t = 0; t < threads; ++t) order[t] = t;
          std::shuffle(order.begin(), order.end(), order_rng());
          for (const size_t t : order) {
            auto& f = fibers[t];
            if (f->done) continue;
            running = true;
            blk.current = f.get();
            threadIdx = uint3{f->tid % block.x, f->tid / block.x % block.y, f->tid / (block.x * block.y)};
            swapcontext(&blk.scheduler, &f->ctx);
          }
          if (running && progress == g_progress)
            throw std::runtime_error("emulation deadlock: every live thread waits at a barrier the others never reach");
        }
        g_block = nullptr;
      }
}

inline float bf16_bits_to_float(uint32_t h) {
  const uint32_t bits = h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float bf16_lo(uint32_t r) { return bf16_bits_to_float(r & 0xffffu); }
inline float bf16_hi(uint32_t r) { return bf16_bits_to_float(r >> 16); }

// cudaMemcpy2DAsync's rows, on host memory.
inline void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
  for (size_t r = 0; r < height; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
}

inline void check(cudaError_t err, const char* expr) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("emulated CUDA call failed: ") + expr);
}

}  // namespace emu

// What common.cuh's launch_kernel calls in emulation.
template <class F>
void emulated_launch(dim3 grid, dim3 block, size_t dynamic_smem, const void* kernel, F&& body) {
  emu::launch(grid, block, dynamic_smem, kernel, std::function<void()>(body));
}

// The runtime calls of the launchers, on host memory. (After the CUDA headers, so their
// declarations stay intact.)
#define CUDA_CHECK(expr) ::emu::check((expr), #expr)
#define cudaMemcpyAsync(dst, src, bytes, kind, stream) ((void)(stream), std::memcpy((dst), (src), (bytes)), cudaSuccess)
#define cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream) \
  ((void)(stream), ::emu::copy_2d((dst), (dpitch), (src), (spitch), (width), (height)), cudaSuccess)
#define cudaMemsetAsync(dst, value, bytes, stream) ((void)(stream), std::memset((dst), (value), (bytes)), cudaSuccess)
#define cudaStreamSynchronize(stream) ((void)(stream), cudaSuccess)  // every call above has finished
#define cudaFuncSetAttribute(kernel, attr, value) ((void)(kernel), (void)(value), cudaSuccess)
#define cudaGetDevice(dev) (*(dev) = 0, cudaSuccess)
#define cudaDeviceGetAttribute(value, attr, dev) (*(value) = 9, cudaSuccess)  // an sm_90 device

inline void __syncthreads() { emu::wait(emu::g_block->bar); }

template <class V>
V __shfl_sync(unsigned, V v, int src, int = 32) {
  return emu::exchange(v, unsigned(src));
}
template <class V>
V __shfl_xor_sync(unsigned, V v, int lane_mask, int = 32) {
  return emu::exchange(v, emu::my_lane() ^ unsigned(lane_mask));
}
inline int __any_sync(unsigned, int pred) {
  emu::Warp& w = emu::my_warp();
  w.buf[emu::my_lane()][0] = pred != 0;
  emu::wait(w.bar);
  int any = 0;
  for (int l = 0; l < 32; ++l) any |= w.buf[l][0];
  emu::wait(w.bar);
  return any;
}
[[noreturn]] inline void __trap() { std::abort(); }
// Rounded products and sums, never fused (host code here is built without FMA contraction).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, c += a·b, from the PTX ISA's fragment
// tables (g = lane / 4, t = lane % 4):
//   A 16×16: a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B 16×8:  b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C 16×8:  c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// (the lower index of each pair in the low 16 bits).
inline void emulated_mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emu::Warp& w = emu::my_warp();
  const unsigned lane = emu::my_lane();
  std::memcpy(w.a[lane], a, sizeof(a));
  std::memcpy(w.b[lane], b, sizeof(b));
  std::memcpy(w.c[lane], c, sizeof(c));
  emu::wait(w.bar);
  float A[16][16], B[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    const unsigned g = l / 4, t = l % 4;
    const uint32_t* al = w.a[l];
    A[g][2 * t] = emu::bf16_lo(al[0]), A[g][2 * t + 1] = emu::bf16_hi(al[0]);
    A[g + 8][2 * t] = emu::bf16_lo(al[1]), A[g + 8][2 * t + 1] = emu::bf16_hi(al[1]);
    A[g][2 * t + 8] = emu::bf16_lo(al[2]), A[g][2 * t + 9] = emu::bf16_hi(al[2]);
    A[g + 8][2 * t + 8] = emu::bf16_lo(al[3]), A[g + 8][2 * t + 9] = emu::bf16_hi(al[3]);
    B[2 * t][g] = emu::bf16_lo(w.b[l][0]), B[2 * t + 1][g] = emu::bf16_hi(w.b[l][0]);
    B[2 * t + 8][g] = emu::bf16_lo(w.b[l][1]), B[2 * t + 9][g] = emu::bf16_hi(w.b[l][1]);
  }
  const unsigned g = lane / 4, t = lane % 4;
  const unsigned rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  float d[4];
  for (int e = 0; e < 4; ++e) {
    float s = w.c[lane][e];
    for (int k = 0; k < 16; ++k) s += A[rows[e]][k] * B[k][cols[e]];
    d[e] = s;
  }
  emu::wait(w.bar);  // every lane has read the operands
  std::memcpy(c, d, sizeof(d));
}
