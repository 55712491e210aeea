// The optimizer's device side (see optim.h).
#include "device/cuda/optim.h"

#include <cuda_runtime_api.h>

#include <cmath>

#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/optim.cuh"
#include "device/cuda/device.h"

namespace autosp::gpu {
namespace {

cudaStream_t stream_of(const Tensor& t) {
  AUTOSP_ASSERT(t.device().kind == DeviceKind::cuda, "device optimizer on ", t.str(), " on ", t.device().str());
  AUTOSP_ASSERT(t.is_contiguous(), "device optimizer on a strided ", t.str());
  return compute_stream(t.device().index);
}

}  // namespace

double global_norm(const std::vector<Tensor>& grads) {
  if (grads.empty()) return 0.0;
  const Device dev = grads[0].device();
  cudaStream_t s = stream_of(grads[0]);
  Tensor partial = Tensor::empty({static_cast<int64_t>(grads.size())}, DType::f64, cuda_allocator(dev.index));
  double* out = static_cast<double*>(partial.raw());
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    AUTOSP_ASSERT(g.device() == dev, "gradients on ", g.device().str(), " and ", dev.str());
    stream_of(g);
    switch (g.dtype()) {
      case DType::f32: cuda::sum_squares(static_cast<const float*>(g.raw()), g.numel(), out + i, s); break;
      case DType::f64: cuda::sum_squares(static_cast<const double*>(g.raw()), g.numel(), out + i, s); break;
      case DType::bf16: cuda::sum_squares(static_cast<const cuda::bf16*>(g.raw()), g.numel(), out + i, s); break;
      default: AUTOSP_ASSERT(false, "gradient norm of ", g.str());
    }
  }
  const std::vector<double> sums = to_device(partial, Device{}).to_doubles();
  double sq = 0;
  for (double v : sums) sq += v;
  return std::sqrt(sq);
}

void scale(const std::vector<Tensor>& grads, double coef) {
  for (const Tensor& g : grads) {
    cudaStream_t s = stream_of(g);
    switch (g.dtype()) {
      case DType::f32: {
        auto* p = static_cast<float*>(g.raw());
        cuda::unary(cuda::Unary::scale, p, p, g.numel(), coef, s);
        break;
      }
      case DType::f64: {
        auto* p = static_cast<double*>(g.raw());
        cuda::unary(cuda::Unary::scale, p, p, g.numel(), coef, s);
        break;
      }
      case DType::bf16: {
        auto* p = static_cast<cuda::bf16*>(g.raw());
        cuda::unary(cuda::Unary::scale, p, p, g.numel(), coef, s);
        break;
      }
      default: AUTOSP_ASSERT(false, "scaling ", g.str());
    }
  }
}

Tensor zeros_like(const Tensor& t) {
  Tensor z = Tensor::empty(t.shape(), t.dtype(), cuda_allocator(t.device().index));
  if (z.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(z.raw(), 0, z.nbytes(), stream_of(z)));
  return z;
}

void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step) {
  cudaStream_t s = stream_of(p);
  for (const Tensor* t : {&g, &m, &v}) {
    stream_of(*t);
    AUTOSP_ASSERT(t->device() == p.device() && t->numel() == p.numel(), "AdamW state ", t->str(), " for ", p.str());
  }
  AUTOSP_ASSERT(m.dtype() == p.dtype() && v.dtype() == p.dtype(), "AdamW moments ", m.str(), " for ", p.str());
  if (p.dtype() == DType::f32 && g.dtype() == DType::f32) {
    cuda::adamw_step<float, float>(static_cast<float*>(p.raw()), static_cast<const float*>(g.raw()),
                                   static_cast<float*>(m.raw()), static_cast<float*>(v.raw()), nullptr, p.numel(), lr,
                                   beta1, beta2, eps, weight_decay, step, nullptr, s);
  } else if (p.dtype() == DType::f32 && g.dtype() == DType::bf16) {
    cuda::adamw_step<float, cuda::bf16>(static_cast<float*>(p.raw()), static_cast<const cuda::bf16*>(g.raw()),
                                        static_cast<float*>(m.raw()), static_cast<float*>(v.raw()), nullptr,
                                        p.numel(), lr, beta1, beta2, eps, weight_decay, step, nullptr, s);
  } else if (p.dtype() == DType::f64 && g.dtype() == DType::f64) {
    cuda::adamw_step<double, double>(static_cast<double*>(p.raw()), static_cast<const double*>(g.raw()),
                                     static_cast<double*>(m.raw()), static_cast<double*>(v.raw()), nullptr, p.numel(),
                                     lr, beta1, beta2, eps, weight_decay, step, nullptr, s);
  } else {
    throw UsageError(str("AdamW on CUDA: parameter ", p.str(), " with gradient ", g.str(),
                         " (f32 parameters with f32 or bf16 gradients, or f64 throughout)"));
  }
}

}  // namespace autosp::gpu
