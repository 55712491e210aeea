// The device runtime of builds without CUDA (src/device/cuda/*.h): no device exists and
// every call that needs one is a UsageError saying why. CUDA builds compile src/device/cuda/
// instead, so this file is empty there.
#ifndef AUTOSP_WITH_CUDA

#include "device/cuda/buffers.h"
#include "device/cuda/device.h"
#include "device/cuda/optim.h"

namespace autosp {
namespace {

// Why, and how to get one: CMake says which (CMakeLists.txt: configured with AUTOSP_WITH_CUDA=OFF,
// or no nvcc found).
#ifndef AUTOSP_NO_CUDA_REASON
#define AUTOSP_NO_CUDA_REASON "it was configured without CUDA"
#define AUTOSP_NO_CUDA_FIX "reconfigure with -DAUTOSP_WITH_CUDA=ON"
#endif

[[noreturn]] void no_backend(const char* what) {
  throw UsageError(str(what, ": this build has no CUDA backend (", AUTOSP_NO_CUDA_REASON, "); use runtime.device "
                             "\"cpu\", or ", AUTOSP_NO_CUDA_FIX));
}

}  // namespace

bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
double dense_bf16_peak_tflops(int) { return 0; }
size_t device_memory_bytes(int) { return 0; }
int select_device_for_local_rank() { no_backend("runtime.device \"cuda\""); }
void use_device(int) { no_backend("runtime.device \"cuda\""); }
CachingAllocator& cuda_allocator(int) { no_backend("a CUDA allocator"); }
CUstream_st* compute_stream(int) { no_backend("a CUDA stream"); }
Tensor to_device(const Tensor& t, Device to) {
  if (t.device().kind == DeviceKind::cpu && to.kind == DeviceKind::cpu) return t.clone();
  no_backend(("a copy to " + to.str()).c_str());
}
void copy_on_device(const Tensor&, const Tensor&) { no_backend("a device copy"); }
void synchronize() {}
void drain_stream_slot(int) {}
void check_attention_backend(AttentionBackend backend) {
  if (backend == AttentionBackend::cudnn) no_backend("runtime.attention \"cudnn\"");
}

namespace gpu {
double global_norm(const std::vector<Tensor>&) { no_backend("a device gradient norm"); }
void scale(const std::vector<Tensor>&, double) { no_backend("device gradient clipping"); }
Tensor zeros_like(const Tensor&) { no_backend("a device tensor"); }
void adamw_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double, double, double, double, double,
                int64_t) {
  no_backend("AdamW on a device");
}
void copy_bytes(void*, const void*, size_t, int) { no_backend("a device copy"); }
void sum_parts(const std::vector<const void*>&, void*, int64_t, DType, int) { no_backend("a device sum"); }
void record_event(void*&, int) { no_backend("a CUDA event"); }
void wait_event(void*, int) { no_backend("a CUDA event"); }
void destroy_event(void*) noexcept {}
}  // namespace gpu

}  // namespace autosp

#endif  // AUTOSP_WITH_CUDA
