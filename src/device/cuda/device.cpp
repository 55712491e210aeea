// The CUDA device runtime (see device.h): per-device state (a caching allocator and a compute
// stream per stream slot), device selection by local rank, host <-> device copies.
#include "device/cuda/device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "device/cuda/copy.h"
#include "device/local_rank.h"
#include "device/stream_slot.h"

namespace autosp {
namespace {

// One stream slot of a device (device/stream_slot.h): a stream and the allocator whose blocks are
// reused in its order.
struct SlotState {
  std::unique_ptr<CachingAllocator> alloc;
  cudaStream_t stream = nullptr;
};

// A device's slots by index, each created on first use (slot 0 with the device). Never shrinks:
// slot states live as long as the process, like the tensors that may still free into them.
struct DeviceState {
  std::vector<std::unique_ptr<SlotState>> slots;
};

// Makes `device` current for the scope (allocation and stream creation for a device other than the
// current one), restoring the previous device after.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) CUDA_CHECK(cudaSetDevice(device));
    set_ = prev_ != device;
  }
  ~CurrentDevice() {
    if (set_) cudaSetDevice(prev_);  // a destructor must not throw
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int prev_ = 0;
  bool set_ = false;
};

void* raw_allocate(int device, size_t bytes) {
  CurrentDevice on(device);
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it, or the next launch check would report this stale error
    return nullptr;
  }
  CUDA_CHECK(err);
  return p;
}

void raw_release(int device, void* p) {
  CurrentDevice on(device);
  CUDA_CHECK(cudaFree(p));  // waits for the device: no kernel still uses the segment
}

std::mutex g_mu;
// Never destroyed: tensors that outlive main() (statics) still free into the allocators, and the
// driver reclaims the memory at exit anyway.
std::vector<std::unique_ptr<DeviceState>>& states() {
  static auto* s = new std::vector<std::unique_ptr<DeviceState>>(static_cast<size_t>(cuda_device_count()));
  return *s;
}

void check_index(int device, size_t visible) {
  if (device < 0 || device >= static_cast<int>(visible))
    throw UsageError(str("CUDA device ", device, " does not exist (", visible, " visible)",
                         visible == 0 ? ": no CUDA device is visible to this process" : ""));
}

// Out of memory on `device` although the failing slot's allocator gave its cache back: every
// slot's allocator returns its wholly free segments (thread ranks each have one), and once the
// device has passed every pending free, the stream-ordered pool (cudaMallocAsync: kernel scratch,
// cuDNN's dQ accumulator, GiBs at long S) gives back what it holds unused.
void reclaim_device(int device) {
  std::vector<CachingAllocator*> allocators;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& slot : states()[static_cast<size_t>(device)]->slots)
      if (slot) allocators.push_back(slot->alloc.get());
  }
  for (CachingAllocator* a : allocators) a->empty_cache();  // cudaFree waits for the device
  CurrentDevice on(device);
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaMemPool_t pool = nullptr;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
}

std::unique_ptr<SlotState> make_slot(int device) {
  auto s = std::make_unique<SlotState>();
  s->alloc = std::make_unique<CachingAllocator>(
      Device{DeviceKind::cuda, device},
      RawMemory{[device](size_t n) { return raw_allocate(device, n); }, [device](void* p) { raw_release(device, p); },
                [device] { reclaim_device(device); }});
  CurrentDevice on(device);
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  return s;
}

// The state of `device` with its slot 0, created on first use. Call with g_mu held.
DeviceState& state_locked(int device) {
  auto& all = states();
  check_index(device, all.size());
  auto& st = all[static_cast<size_t>(device)];
  if (!st) {
    auto d = std::make_unique<DeviceState>();
    d->slots.push_back(make_slot(device));
    // The stream-ordered pool keeps what is freed into it instead of unmapping it at every
    // synchronisation (its default release threshold, 0, would re-map the large scratch buffers
    // each step); reclaim_device trims it when memory runs out.
    cudaMemPool_t pool = nullptr;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    st = std::move(d);
  }
  return *st;
}

void ensure_state(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  state_locked(device);
}

// The devices whose slot stream the calling thread has ordered after slot 0 since it entered its
// slot (drain_stream_slot forgets them).
thread_local std::vector<int> t_joined;

// The calling thread's slot of `device`. A slot > 0 is created on first use; the first time this
// thread uses it, its stream waits for what slot 0's stream has queued.
SlotState& slot_of(int device) {
  const size_t slot = static_cast<size_t>(stream_slot());
  SlotState* mine = nullptr;
  cudaStream_t origin = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    DeviceState& d = state_locked(device);
    if (slot == 0) return *d.slots[0];
    if (d.slots.size() <= slot) d.slots.resize(slot + 1);
    if (!d.slots[slot]) d.slots[slot] = make_slot(device);
    mine = d.slots[slot].get();
    origin = d.slots[0]->stream;
  }
  if (std::find(t_joined.begin(), t_joined.end(), device) == t_joined.end()) {
    CurrentDevice on(device);
    cudaEvent_t made = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&made, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(made, origin));
    CUDA_CHECK(cudaStreamWaitEvent(mine->stream, made, 0));
    CUDA_CHECK(cudaEventDestroy(made));  // released once the wait has been satisfied
    t_joined.push_back(device);
  }
  return *mine;
}

int current_device() {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error of any later call
    return 0;
  }
  return n;
}

bool cuda_available() { return cuda_device_count() > 0; }

double dense_bf16_peak_tflops(int device) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const std::string name = prop.name;
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H100") && has("PCIe")) return 756;
  if (has("H100") || has("H200") || has("H800") || has("GH200")) return 989;
  if (has("B200") || has("GB200")) return 2250;
  if (has("A100") || has("A800")) return 312;
  if (has("L40S")) return 362;
  return 0;
}

size_t device_memory_bytes(int device) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.totalGlobalMem;
}

int select_device_for_local_rank() {
  const int d = device_for_local_rank(local_rank_from_env(), local_size_from_env(), cuda_device_count());
  use_device(d);
  return d;
}

void use_device(int device) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    check_index(device, states().size());
  }
  // Current before its state is created: creating it while another device is current would switch
  // to `device` and back, and switching back initialises a context on the previous device (GPU 0
  // by default) in every rank, a few hundred MiB of GPU 0 per rank.
  CUDA_CHECK(cudaSetDevice(device));
  ensure_state(device);
}

CachingAllocator& cuda_allocator(int device) { return *slot_of(device).alloc; }

CUstream_st* compute_stream(int device) { return slot_of(device).stream; }

void drain_stream_slot(int slot) {
  std::vector<int> joined;
  joined.swap(t_joined);
  if (slot == 0) return;
  for (int device : joined) {
    cudaStream_t s = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      s = states()[static_cast<size_t>(device)]->slots[static_cast<size_t>(slot)]->stream;
    }
    CurrentDevice on(device);
    CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

Tensor to_device(const Tensor& t, Device to) {
  AUTOSP_ASSERT(t.defined(), "to_device of an undefined tensor");
  const Device from = t.device();
  if (from.kind == DeviceKind::cpu && to.kind == DeviceKind::cpu) return t.clone();
  if (from.kind == DeviceKind::cpu) {  // host → device
    const Tensor src = t.contiguous();
    Tensor dst = Tensor::empty(t.shape(), t.dtype(), cuda_allocator(to.index));
    // From pageable host memory the call returns once `src` is staged, so `src` may be freed after.
    if (dst.nbytes() > 0)
      CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyHostToDevice, compute_stream(to.index)));
    return dst;
  }
  cudaStream_t s = compute_stream(from.index);
  const Tensor src = gpu::contiguous(t, cuda_allocator(from.index), s);
  if (to.kind == DeviceKind::cpu) {  // device → host, synchronous
    Tensor dst = Tensor::empty(t.shape(), t.dtype());
    if (dst.nbytes() > 0) CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return dst;
  }
  Tensor dst = Tensor::empty(t.shape(), t.dtype(), cuda_allocator(to.index));
  if (dst.nbytes() == 0) return dst;
  if (from.index == to.index) {
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDeviceToDevice, s));
  } else {  // between devices: rare (tests); both streams are drained so neither side races
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaMemcpyPeerAsync(dst.raw(), to.index, src.raw(), from.index, dst.nbytes(), compute_stream(to.index)));
    CUDA_CHECK(cudaStreamSynchronize(compute_stream(to.index)));
  }
  return dst;
}

void copy_on_device(const Tensor& src, const Tensor& dst) {
  AUTOSP_ASSERT(src.dtype() == dst.dtype() && src.device() == dst.device(), "device copy of ", src.str(), " on ",
                src.device().str(), " into ", dst.str(), " on ", dst.device().str());
  gpu::copy_strided_into(src, dst, compute_stream(dst.device().index));
}

void synchronize() { CUDA_CHECK(cudaStreamSynchronize(compute_stream(current_device()))); }

void check_attention_backend(AttentionBackend) {}  // both run here (cudnn falls back where unsupported)

}  // namespace autosp
