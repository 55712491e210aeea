// The CUDA column of the kernel dispatch table (src/engine/dispatch.cpp): one launcher per op,
// mapping the op's tensors onto the launchers of src/kernels/cuda exactly as the CPU launchers map
// them onto src/kernels/cpu (engine/cpu/launchers.h, name for name). Every kernel is enqueued on
// the compute stream of the tensors' device (device/cuda/device.h); nothing synchronises with the
// host. Compiled only in CUDA builds.
//
// Dtypes: f32 and bf16 everywhere, f64 where the kernel has it (not attention); any other is a
// UsageError naming the op and the dtype. Scalars a bf16 op produces (loss, token count, the
// attention log-sum-exp) have the dtype the op table declares; the kernels write them in f32.
// Ids (embedding, rope positions, labels) are widened to int64 on the device. Embedding ids and
// labels are not checked on the host here (that would cost a device-to-host copy per step): an
// out-of-range id gives a NaN row, and so a non-finite loss that stops training; the trainer checks
// the batch on the host before uploading it.
#pragma once

#include "kernels/cpu/elementwise.h"
#include "engine/dispatch.h"

namespace autosp::cuda_ops {

Tensor embedding(const KernelCall& c);
Tensor matmul(const KernelCall& c);
template <cpu::Binary kOp>
Tensor binary(const KernelCall& c);
template <cpu::Unary kOp>
Tensor unary(const KernelCall& c);
Tensor reshape(const KernelCall& c);
Tensor permute(const KernelCall& c);  // transpose and permute
Tensor slice(const KernelCall& c);
Tensor concat(const KernelCall& c);
Tensor layernorm(const KernelCall& c);
Tensor rmsnorm(const KernelCall& c);
Tensor softmax(const KernelCall& c);
template <bool kBackward>
Tensor rope(const KernelCall& c);
Tensor sdpa(const KernelCall& c);
Tensor cross_entropy_sum(const KernelCall& c);
Tensor count_valid(const KernelCall& c);
Tensor full(const KernelCall& c);
Tensor causal_mask(const KernelCall& c);
Tensor all_to_all(const KernelCall& c);
Tensor all_reduce(const KernelCall& c);
Tensor sum_to(const KernelCall& c);
Tensor embedding_backward(const KernelCall& c);
template <cpu::UnaryGrad kOp>
Tensor unary_backward(const KernelCall& c);
Tensor slice_backward(const KernelCall& c);
Tensor layernorm_backward(const KernelCall& c);
Tensor rmsnorm_backward(const KernelCall& c);
Tensor softmax_backward(const KernelCall& c);
Tensor sdpa_backward(const KernelCall& c);
Tensor cross_entropy_backward(const KernelCall& c);
Tensor cast(const KernelCall& c);
// Fused kernels (passes/fuse_elementwise; in launchers.cpp): residual add + norm, bias + tanh-GELU.
Tensor add_layernorm(const KernelCall& c);
Tensor add_rmsnorm(const KernelCall& c);
Tensor bias_gelu_tanh(const KernelCall& c);
Tensor bias_gelu_tanh_backward(const KernelCall& c);

}  // namespace autosp::cuda_ops
