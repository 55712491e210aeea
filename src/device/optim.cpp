// The optimizer's arithmetic on either device (see optim.h): the CPU kernels on host tensors,
// device/cuda/optim.h on CUDA tensors.
#include "device/optim.h"

#include <cmath>

#include "device/cuda/optim.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/optim.h"

namespace autosp {
namespace {
bool on_cuda(const std::vector<Tensor>& ts) { return !ts.empty() && ts[0].device().kind == DeviceKind::cuda; }
}  // namespace

double grads_sum_of_squares(const std::vector<Tensor>& grads) {
  if (on_cuda(grads)) {
    const double norm = gpu::global_norm(grads);
    return norm * norm;
  }
  double sq = 0;
  for (const Tensor& g : grads) {
    if (g.dtype() == DType::f32)
      sq += cpu::sum_squares(g.data<float>(), g.numel());
    else
      sq += cpu::sum_squares(g.data<double>(), g.numel());
  }
  return sq;
}

double grads_norm(const std::vector<Tensor>& grads) {
  if (on_cuda(grads)) return gpu::global_norm(grads);
  return std::sqrt(grads_sum_of_squares(grads));
}

void scale_grads(const std::vector<Tensor>& grads, double coef) {
  if (on_cuda(grads)) return gpu::scale(grads, coef);
  for (const Tensor& g : grads) {
    if (g.dtype() == DType::f32)
      cpu::unary(cpu::Unary::scale, g.data<float>(), g.data<float>(), g.numel(), coef);
    else
      cpu::unary(cpu::Unary::scale, g.data<double>(), g.data<double>(), g.numel(), coef);
  }
}

Tensor zeros_like(const Tensor& t) {
  return t.device().kind == DeviceKind::cuda ? gpu::zeros_like(t) : Tensor::zeros(t.shape(), t.dtype());
}

void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step) {
  if (p.device().kind == DeviceKind::cuda)
    gpu::adamw_step(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step);
  else if (p.dtype() == DType::f32)
    cpu::adamw_step(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), p.numel(), lr, beta1, beta2,
                    eps, weight_decay, step);
  else
    cpu::adamw_step(p.data<double>(), g.data<double>(), m.data<double>(), v.data<double>(), p.numel(), lr, beta1,
                    beta2, eps, weight_decay, step);
}

}  // namespace autosp
