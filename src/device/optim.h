// The optimizer's arithmetic on tensors of either device: gradient norms, clipping, zero moments
// and the AdamW step. Host tensors run the CPU kernels (kernels/cpu/elementwise.h, optim.h); CUDA
// tensors the device side (device/cuda/optim.h, on the compute stream). train/optimizer.cpp calls
// these, so it names no kernel. Tensors of one call are all on one device. Knows nothing of
// graphs, communicators or the training loop.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace autosp {

// Σ over every gradient of Σ g² (host: each tensor's sum in double, f32 or f64; CUDA: the device's
// deterministic norm, squared).
double grads_sum_of_squares(const std::vector<Tensor>& grads);

// sqrt(grads_sum_of_squares) (CUDA: the device's norm as it computes it).
double grads_norm(const std::vector<Tensor>& grads);

// g *= coef for every gradient, in place.
void scale_grads(const std::vector<Tensor>& grads, double coef);

// A zero tensor of t's shape and dtype on t's device.
Tensor zeros_like(const Tensor& t);

// One AdamW step of p (PyTorch semantics): p, g, m, v contiguous, one shape; p, m, v f32 (g f32,
// or bf16 on CUDA) or all f64; updated in place.
void adamw_step(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step);

}  // namespace autosp
