// Raw buffers on either device (see buffers.h): the host loops here, CUDA through
// device/cuda/buffers.h.
#include "device/buffers.h"

#include <cstring>

#include "device/cuda/buffers.h"
#include "device/cuda/device.h"
#include "tensor/convert.h"

namespace autosp {
namespace {

template <class T>
void sum_host(const std::vector<const void*>& parts, void* dst, int64_t n) {
  T* out = static_cast<T*>(dst);
  for (int64_t e = 0; e < n; ++e) {
    T acc = static_cast<const T*>(parts[0])[e];
    for (size_t i = 1; i < parts.size(); ++i) acc += static_cast<const T*>(parts[i])[e];
    out[e] = acc;
  }
}

}  // namespace

void copy_bytes(void* dst, const void* src, size_t n, Device d) {
  if (n == 0 || dst == src) return;
  if (d.kind == DeviceKind::cpu) {
    std::memcpy(dst, src, n);
    return;
  }
  gpu::copy_bytes(dst, src, n, d.index);
}

void sum_parts(const std::vector<const void*>& parts, void* dst, int64_t n, DType dtype, Device d) {
  if (n == 0) return;
  if (d.kind != DeviceKind::cpu) return gpu::sum_parts(parts, dst, n, dtype, d.index);
  switch (dtype) {
    case DType::f32: return sum_host<float>(parts, dst, n);
    case DType::f64: return sum_host<double>(parts, dst, n);
    case DType::i64: return sum_host<int64_t>(parts, dst, n);
    case DType::bf16: {
      uint16_t* out = static_cast<uint16_t*>(dst);
      for (int64_t e = 0; e < n; ++e) {
        float acc = 0;
        for (const void* p : parts) acc += cpu::bf16_to_f32(static_cast<const uint16_t*>(p)[e]);
        out[e] = cpu::f32_to_bf16(acc);
      }
      return;
    }
    default: break;
  }
  AUTOSP_ASSERT(false, "sum of ", dtype_name(dtype), " parts on the host (f32, f64, bf16, i64 only)");
}

Allocator& allocator_of(Device d) {
  return d.kind == DeviceKind::cuda ? static_cast<Allocator&>(cuda_allocator(d.index)) : cpu_allocator();
}

Tensor empty_on(int64_t n, DType dtype, Device d) { return Tensor::empty({n}, dtype, allocator_of(d)); }

void record_event(void*& event, Device d) {
  if (d.kind == DeviceKind::cuda) gpu::record_event(event, d.index);
}

void wait_event(void* event, Device d) {
  if (d.kind == DeviceKind::cuda) gpu::wait_event(event, d.index);
}

void destroy_event(void* event) noexcept {
  if (event) gpu::destroy_event(event);
}

}  // namespace autosp
