// autosp-nccl-test: the NCCL communicator (comm/nccl.h) on real GPUs, one per rank, under mpirun
// (tests/cuda/nccl_test.sh skips with 77 when there are fewer CUDA devices than ranks). Every
// result is compared with a closed form computed on the host; values name the rank (and chunk)
// they came from. Results are read back with copies enqueued on the compute stream, so each check
// also tests that the collective is ordered before later compute-stream work. Meaningful at one
// rank (all-to-all identity, in-place paths, async ordering, split, errors) and fully checking at
// two or more (plus a peer that never joins a collective: the deadline aborts and throws).
//
//   autosp-nccl-test                  (under mpirun; exit 0 all passed, 1 a check failed, 77 skipped)
//   autosp-nccl-test --device-count   (prints cudaGetDeviceCount; exit 1 when there is none)
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/device_count.h"
#include "comm/communicator.h"
#include "comm/nccl.h"
#include "tensor/tensor.h"

using namespace autosp;

namespace {

int g_rank = 0;
int g_failures = 0;

#define EXPECT(cond, ...)                                                                                  \
  do {                                                                                                     \
    if (!(cond)) {                                                                                         \
      ++g_failures;                                                                                        \
      std::fprintf(stderr, "rank %d: FAILED %s:%d: %s %s\n", g_rank, __FILE__, __LINE__, #cond,           \
                   str(__VA_ARGS__).c_str());                                                              \
    }                                                                                                      \
  } while (0)

#define TEST_CUDA(expr)                                                                                     \
  do {                                                                                                      \
    const cudaError_t e_ = (expr);                                                                          \
    if (e_ != cudaSuccess) throw std::runtime_error(str(#expr, ": ", cudaGetErrorString(e_), " at line ", __LINE__)); \
  } while (0)

class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}
  void* allocate(size_t n) override {
    void* p = nullptr;
    if (n > 0) TEST_CUDA(cudaMalloc(&p, n));
    note_alloc(n);
    return p;
  }
  void deallocate(void* p, size_t n) override {
    cudaFree(p);
    note_free(n);
  }
  Device device() const override { return {DeviceKind::cuda, device_}; }

 private:
  int device_;
};

struct Env {
  Communicator& mpi;
  NcclCommunicator* world;  // null in the timeout test
  cudaStream_t compute;
  DeviceAllocator& alloc;
  int P, r;
};

uint16_t bf16_bits(float f) {  // exact for the small integers used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Host ↔ device through the compute stream (so a read sees every collective joined before it).
template <class T>
Tensor upload(Env& e, const std::vector<T>& h, DType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(h.size())}, dtype, e.alloc);
  if (!h.empty()) {
    TEST_CUDA(cudaMemcpyAsync(t.raw(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, e.compute));
    TEST_CUDA(cudaStreamSynchronize(e.compute));
  }
  return t;
}
template <class T>
std::vector<T> download(Env& e, const Tensor& t) {
  std::vector<T> h(static_cast<size_t>(t.numel()));
  if (!h.empty()) TEST_CUDA(cudaMemcpyAsync(h.data(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, e.compute));
  TEST_CUDA(cudaStreamSynchronize(e.compute));
  return h;
}

int64_t tri(int P) { return int64_t(P) * (P + 1) / 2; }  // Σ_r (r + 1)

void test_all_reduce(Env& e) {
  const int n = 1000;
  {  // f32
    std::vector<float> h(n);
    for (int i = 0; i < n; ++i) h[i] = float((e.r + 1) * (i % 17));
    Tensor t = upload(e, h, DType::f32);
    e.world->all_reduce_sum(t);
    const auto got = download<float>(e, t);
    for (int i = 0; i < n; ++i) EXPECT(got[i] == float((i % 17) * tri(e.P)), "f32 i ", i, " got ", got[i]);
  }
  {  // f64
    std::vector<double> h(n);
    for (int i = 0; i < n; ++i) h[i] = (e.r + 1) * (i + 0.25);
    Tensor t = upload(e, h, DType::f64);
    e.world->all_reduce_sum(t);
    const auto got = download<double>(e, t);
    for (int i = 0; i < n; ++i) EXPECT(got[i] == (i + 0.25) * double(tri(e.P)), "f64 i ", i, " got ", got[i]);
  }
  {  // i64 beyond 32 bits
    std::vector<int64_t> h(n);
    for (int i = 0; i < n; ++i) h[i] = int64_t(e.r + 1) * i + 1000000000000LL;
    Tensor t = upload(e, h, DType::i64);
    e.world->all_reduce_sum(t);
    const auto got = download<int64_t>(e, t);
    for (int i = 0; i < n; ++i)
      EXPECT(got[i] == i * tri(e.P) + e.P * 1000000000000LL, "i64 i ", i, " got ", got[i]);
  }
  {  // bf16 (sums ≤ 252 stay exact for up to 8 ranks)
    std::vector<uint16_t> h(n);
    for (int i = 0; i < n; ++i) h[i] = bf16_bits(float((e.r + 1) * (i % 8)));
    Tensor t = upload(e, h, DType::bf16);
    e.world->all_reduce_sum(t);
    const auto got = download<uint16_t>(e, t);
    if (e.P <= 8)
      for (int i = 0; i < n; ++i)
        EXPECT(bf16_value(got[i]) == float((i % 8) * tri(e.P)), "bf16 i ", i, " got ", bf16_value(got[i]));
  }
  {  // empty
    Tensor t = Tensor::empty({0}, DType::f32, e.alloc);
    e.world->all_reduce_sum(t);
  }
}

void test_broadcast(Env& e) {
  const int root = e.P - 1, n = 777;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = e.r == root ? i * 0.5f + root : -1.f;
  Tensor t = upload(e, h, DType::f32);
  e.world->broadcast(t, root);
  const auto got = download<float>(e, t);
  for (int i = 0; i < n; ++i) EXPECT(got[i] == i * 0.5f + root, "i ", i, " got ", got[i]);
}

void test_all_to_all(Env& e) {
  const int c = 6;
  std::vector<float> h(size_t(e.P) * c);
  for (int j = 0; j < e.P; ++j)
    for (int k = 0; k < c; ++k) h[j * c + k] = float(e.r * 1000 + j * 10 + k);  // chunk j goes to rank j
  for (bool in_place : {false, true}) {
    Tensor in = upload(e, h, DType::f32);
    Tensor out = in_place ? in : Tensor::empty({int64_t(h.size())}, DType::f32, e.alloc);
    e.world->all_to_all(in, out);
    const auto got = download<float>(e, out);
    for (int i = 0; i < e.P; ++i)
      for (int k = 0; k < c; ++k)
        EXPECT(got[i * c + k] == float(i * 1000 + e.r * 10 + k), "in_place ", in_place, " chunk ", i, " k ", k,
               " got ", got[i * c + k]);
    if (!in_place) {  // the input is untouched
      const auto src = download<float>(e, in);
      EXPECT(src == h, "all_to_all changed its input");
    }
  }
}

void test_all_gather(Env& e) {
  const int c = 5;
  std::vector<float> mine(c);
  for (int k = 0; k < c; ++k) mine[k] = float(e.r * 100 + k);
  for (bool async : {false, true})  // all_gather_async: ZeRO-3's prefetch, joined by wait()
    for (bool in_place : {false, true}) {
      Tensor out = Tensor::empty({int64_t(e.P) * c}, DType::f32, e.alloc);
      Tensor in;
      if (in_place) {
        in = Tensor::view_bytes(out, size_t(e.r) * c * sizeof(float), {c}, DType::f32);
        TEST_CUDA(cudaMemcpyAsync(in.raw(), mine.data(), c * sizeof(float), cudaMemcpyHostToDevice, e.compute));
      } else {
        in = upload(e, mine, DType::f32);
      }
      if (async)
        e.world->all_gather_async(in, out)->wait();
      else
        e.world->all_gather(in, out);
      const auto got = download<float>(e, out);
      for (int i = 0; i < e.P; ++i)
        for (int k = 0; k < c; ++k)
          EXPECT(got[i * c + k] == float(i * 100 + k), "async ", async, " in_place ", in_place, " rank ", i, " k ", k,
                 " got ", got[i * c + k]);
    }
}

// The async all-reduce sees compute-stream work enqueued before it (a slow memset chain, then the
// values), and its result is seen by compute-stream work enqueued after test()/wait() (or after
// the handle is destroyed), with no host synchronisation in between.
void test_async_ordering(Env& e) {
  const size_t big = size_t(1) << 30;
  void* slow = nullptr;
  TEST_CUDA(cudaMalloc(&slow, big));
  const int n = 4096;
  float* pinned = nullptr;
  TEST_CUDA(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float)));
  for (int variant = 0; variant < 3; ++variant) {  // 0: poll test(), 1: wait(), 2: destroy unwaited
    Tensor t = Tensor::empty({n}, DType::f32, e.alloc);
    TEST_CUDA(cudaMemsetAsync(t.raw(), 0, t.nbytes(), e.compute));
    for (int i = 0; i < 8; ++i) TEST_CUDA(cudaMemsetAsync(slow, i, big, e.compute));  // ~ms of work first
    for (int i = 0; i < n; ++i) pinned[i] = float((e.r + 1) * (i % 13) + variant);
    TEST_CUDA(cudaMemcpyAsync(t.raw(), pinned, n * sizeof(float), cudaMemcpyHostToDevice, e.compute));
    {
      auto pending = e.world->all_reduce_sum_async(t);
      if (variant == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        bool done = false;
        while (!(done = pending->test()) &&
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 60) {
        }
        EXPECT(done, "test() never said done within 60 s");
        EXPECT(pending->test(), "test() after done");
      } else if (variant == 1) {
        pending->wait();
        pending->wait();  // twice is fine
      }
    }  // variant 2: the destructor joins the compute stream
    // Overwrite the host buffer: the read below must come from the device.
    for (int i = 0; i < n; ++i) pinned[i] = -7.f;
    TEST_CUDA(cudaMemcpyAsync(pinned, t.raw(), n * sizeof(float), cudaMemcpyDeviceToHost, e.compute));
    TEST_CUDA(cudaStreamSynchronize(e.compute));
    for (int i = 0; i < n; ++i) {
      const float expect = float((i % 13) * tri(e.P) + int64_t(variant) * e.P);
      EXPECT(pinned[i] == expect, "variant ", variant, " i ", i, " got ", pinned[i], " expected ", expect);
      if (pinned[i] != expect) break;
    }
  }
  TEST_CUDA(cudaFreeHost(pinned));
  TEST_CUDA(cudaFree(slow));
}

void test_split(Env& e) {
  // Ranks of the same parity, in reverse rank order.
  auto child = e.world->split(e.r % 2, -e.r);
  int members = 0, position = 0;
  int64_t sum = 0;
  for (int q = 0; q < e.P; ++q)
    if (q % 2 == e.r % 2) {
      ++members;
      sum += q + 1;
      if (q > e.r) ++position;
    }
  EXPECT(child->size() == members, "child size ", child->size(), " expected ", members);
  EXPECT(child->rank() == position, "child rank ", child->rank(), " expected ", position);
  EXPECT(child->backend() == "nccl", child->backend());
  Tensor t = upload(e, std::vector<int64_t>{e.r + 1, 1}, DType::i64);
  child->all_reduce_sum(t);
  const auto got = download<int64_t>(e, t);
  EXPECT(got[0] == sum && got[1] == members, "child all_reduce got ", got[0], ", ", got[1]);
  child->barrier();
}

void test_errors(Env& e) {
  Tensor host = Tensor::from_vector<float>({4}, {1, 2, 3, 4});
  try {
    e.world->all_reduce_sum(host);
    EXPECT(false, "a CPU tensor was accepted");
  } catch (const std::exception& ex) {
    EXPECT(std::string(ex.what()).find("is not a CUDA tensor") != std::string::npos, ex.what());
  }
  Tensor i32 = Tensor::empty({4}, DType::i32, e.alloc);
  try {
    e.world->all_reduce_sum(i32);
    EXPECT(false, "an i32 all_reduce was accepted");
  } catch (const std::exception& ex) {
    EXPECT(std::string(ex.what()).find("f32, f64, bf16, i64") != std::string::npos, ex.what());
  }
  Tensor odd = Tensor::empty({int64_t(e.P) * 4 + 1}, DType::f32, e.alloc);
  if (e.P > 1) {
    try {
      e.world->all_to_all(odd, odd);
      EXPECT(false, "an all_to_all that does not split was accepted");
    } catch (const std::exception& ex) {
      EXPECT(std::string(ex.what()).find("do not split") != std::string::npos, ex.what());
    }
  }
}

// A peer that never joins: rank 0 skips one all-reduce of a communicator with a 3 s deadline; the
// others' synchronize() must throw within the deadline (naming AUTOSP_COLLECTIVE_TIMEOUT) instead of
// hanging.
void test_timeout(Env& e) {
  auto shortlived = make_nccl_communicator(e.mpi, e.compute, 3.0);
  if (e.r != 0) {
    Tensor t = upload(e, std::vector<float>{1, 2, 3}, DType::f32);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      shortlived->all_reduce_sum(t);
      shortlived->synchronize();
      EXPECT(false, "synchronize() returned although rank 0 never joined");
    } catch (const RuntimeFailure& ex) {
      EXPECT(std::string(ex.what()).find("AUTOSP_COLLECTIVE_TIMEOUT") != std::string::npos, ex.what());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT(s < 30, "the deadline took ", s, " s");
  }
  e.mpi.barrier();
  shortlived.reset();  // rank 0: finalize may find its peers gone; bounded by the 3 s deadline
}

}  // namespace

int main(int argc, char** argv) {
  if (const int rc = autosp::cudatest::device_count_mode(argc, argv); rc >= 0) return rc;
  auto mpi = make_world_communicator();
  g_rank = mpi->rank();
  const int P = mpi->size();
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* local_n = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int local_rank = local ? std::atoi(local) : g_rank, local_size = local_n ? std::atoi(local_n) : P;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  Tensor skip = Tensor::from_vector<int64_t>({1}, {err != cudaSuccess || count < local_size ? 1 : 0});
  mpi->all_reduce_sum(skip);
  if (skip.data<int64_t>()[0] != 0) {
    if (g_rank == 0)
      std::printf("skipping: %d CUDA device(s) (%s) for %d local rank(s)\n", count,
                  err != cudaSuccess ? cudaGetErrorString(err) : "ok", local_size);
    if (P == 1) return 77;
    mpi->barrier();
    std::fflush(stdout);
    std::_Exit(77);  // every rank leaves with 77 (no MPI_Abort from the exit hook)
  }

  int failed_total = 0;
  try {
    TEST_CUDA(cudaSetDevice(local_rank % count));
    cudaStream_t compute = nullptr;
    TEST_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    DeviceAllocator alloc(local_rank % count);
    {
      auto world = make_nccl_communicator(*mpi, compute, 120.0);
      EXPECT(world->rank() == g_rank && world->size() == P, "nccl rank ", world->rank(), " of ", world->size());
      Env e{*mpi, world.get(), compute, alloc, P, g_rank};
      const std::pair<const char*, void (*)(Env&)> tests[] = {
          {"all_reduce_sum", test_all_reduce}, {"broadcast", test_broadcast},     {"all_to_all", test_all_to_all},
          {"all_gather", test_all_gather},     {"async ordering", test_async_ordering}, {"split", test_split},
          {"errors", test_errors},
      };
      for (const auto& [name, fn] : tests) {
        const int before = g_failures;
        fn(e);
        world->barrier();
        if (g_rank == 0) std::printf("%-16s %s\n", name, g_failures == before ? "ok" : "FAILED");
      }
      world->synchronize();
    }
    if (P > 1) {
      const int before = g_failures;
      cudaStream_t other = nullptr;
      TEST_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
      DeviceAllocator alloc2(local_rank % count);
      // A stream of its own: after the abort its done event never fires.
      Env e2{*mpi, nullptr, other, alloc2, P, g_rank};
      test_timeout(e2);
      if (g_rank == 0) std::printf("%-16s %s\n", "peer timeout", g_failures == before ? "ok" : "FAILED");
    }
    TEST_CUDA(cudaStreamDestroy(compute));
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, ex.what());
    return 1;  // the MPI exit hook ends the other ranks
  }
  Tensor failed = Tensor::from_vector<int64_t>({1}, {g_failures});
  mpi->all_reduce_sum(failed);
  failed_total = static_cast<int>(failed.data<int64_t>()[0]);
  if (g_rank == 0) std::printf("%d rank(s): %d failed check(s)\n", P, failed_total);
  mpi.reset();
  return failed_total == 0 ? 0 : 1;
}
