// Device-side strided copies and casts (see copy.h).
#include "device/cuda/copy.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda/elementwise.cuh"

namespace autosp::gpu {

void copy_strided_into(const Tensor& view, const Tensor& dst, cudaStream_t s) {
  AUTOSP_ASSERT(view.device().kind == DeviceKind::cuda && dst.device().kind == DeviceKind::cuda,
                "device copy of ", view.str(), " on ", view.device().str(), " into ", dst.device().str());
  AUTOSP_ASSERT(dst.is_contiguous() && dst.shape() == view.shape() && dtype_size(dst.dtype()) == dtype_size(view.dtype()),
                "strided copy of ", view.str(), " into ", dst.str());
  if (view.numel() == 0) return;
  if (view.rank() == 0) {
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), view.raw(), dtype_size(view.dtype()), cudaMemcpyDeviceToDevice, s));
    return;
  }
  AUTOSP_ASSERT(view.rank() <= kMaxRank, "rank ", view.rank(), " exceeds ", kMaxRank);
  const int64_t* sh = view.shape().data();
  const int64_t* st = view.strides().data();
  switch (dtype_size(view.dtype())) {
    case 2:
      cuda::copy_strided(view.rank(), sh, static_cast<const uint16_t*>(view.raw()), st,
                         static_cast<uint16_t*>(dst.raw()), s);
      break;
    case 4:
      cuda::copy_strided(view.rank(), sh, static_cast<const int32_t*>(view.raw()), st,
                         static_cast<int32_t*>(dst.raw()), s);
      break;
    case 8:
      cuda::copy_strided(view.rank(), sh, static_cast<const int64_t*>(view.raw()), st,
                         static_cast<int64_t*>(dst.raw()), s);
      break;
    default: AUTOSP_ASSERT(false, "element size ", dtype_size(view.dtype()));
  }
}

Tensor contiguous(const Tensor& t, Allocator& alloc, cudaStream_t s) {
  if (t.is_contiguous()) return t;
  Tensor y = Tensor::empty(t.shape(), t.dtype(), alloc);
  copy_strided_into(t, y, s);
  return y;
}

namespace {
template <class Src, class Dst>
void run_cast(const Tensor& src, const Tensor& dst, cudaStream_t s) {
  cuda::cast<Src, Dst>(static_cast<const Src*>(src.raw()), static_cast<Dst*>(dst.raw()), src.numel(), s);
}
}  // namespace

void cast_into(const Tensor& src, const Tensor& dst, cudaStream_t s) {
  AUTOSP_ASSERT(src.is_contiguous() && dst.is_contiguous() && src.shape() == dst.shape(), "cast of ", src.str(),
                " into ", dst.str());
  AUTOSP_ASSERT(src.device().kind == DeviceKind::cuda && dst.device().kind == DeviceKind::cuda, "device cast on ",
                src.device().str(), " and ", dst.device().str());
  if (src.numel() == 0) return;
  const DType a = src.dtype(), b = dst.dtype();
  if (a == b) {
    if (src.raw() != dst.raw())
      CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, s));
    return;
  }
  using cuda::bf16;
  using cuda::f16;
  if (a == DType::f32 && b == DType::bf16) return run_cast<float, bf16>(src, dst, s);
  if (a == DType::bf16 && b == DType::f32) return run_cast<bf16, float>(src, dst, s);
  if (a == DType::f32 && b == DType::f16) return run_cast<float, f16>(src, dst, s);
  if (a == DType::f16 && b == DType::f32) return run_cast<f16, float>(src, dst, s);
  if (a == DType::f32 && b == DType::f64) return run_cast<float, double>(src, dst, s);
  if (a == DType::f64 && b == DType::f32) return run_cast<double, float>(src, dst, s);
  if (a == DType::f64 && b == DType::bf16) return run_cast<double, bf16>(src, dst, s);
  if (a == DType::bf16 && b == DType::f64) return run_cast<bf16, double>(src, dst, s);
  if (a == DType::i32 && b == DType::i64) return run_cast<int32_t, int64_t>(src, dst, s);
  if (a == DType::i64 && b == DType::i32) return run_cast<int64_t, int32_t>(src, dst, s);
  throw UsageError(str("no CUDA conversion from ", dtype_name(a), " to ", dtype_name(b),
                       " (the device casts between f32, f64 and bf16, f32 <-> f16 and i32 <-> i64)"));
}

Tensor cast(const Tensor& t, DType dtype, Allocator& alloc, cudaStream_t s) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  const Tensor src = contiguous(t, alloc, s);
  if (src.dtype() == dtype) return src;
  Tensor y = Tensor::empty(t.shape(), dtype, alloc);
  cast_into(src, y, s);
  return y;
}

}  // namespace autosp::gpu
