// The optimizer's device side (device/optim.h calls it for tensors on a CUDA device): the
// global gradient norm, clipping, zero moments and the fused AdamW step over the kernels of
// kernels/cuda/{elementwise,optim}, on the device's compute stream. No CUDA header needed; builds
// without CUDA get stubs that throw UsageError (device/cuda_absent.cpp).
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace autosp::gpu {

// sqrt(Σ over every gradient of Σ g²): each gradient's sum of squares in double on the device (a
// deterministic reduction), the partial sums read back once (this synchronises the host with the
// compute stream) and added in order.
double global_norm(const std::vector<Tensor>& grads);

// g *= coef for every gradient, in place.
void scale(const std::vector<Tensor>& grads, double coef);

// A zero tensor of t's shape and dtype on t's device.
Tensor zeros_like(const Tensor& t);

// One AdamW step of p (PyTorch semantics, as cpu::adamw_step): p, m, v f32 (g f32 or bf16) or all
// f64; updated in place.
void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step);

}  // namespace autosp::gpu
