// The CPU column of the kernel dispatch table (engine/dispatch.cpp): one launcher per op, mapping
// the op's tensors onto the kernels of src/kernels/cpu. The CPU launchers are the reference the
// CUDA ones (engine/cuda/launchers.h) mirror, name for name.
//
// Dtypes: f32 and f64. bf16 is emulated (emulates_bf16 / bf16_via_f32): a node that computes
// (ops.h: Numerics::computes) with a bf16 input or output runs its f32 launcher on inputs widened
// to f32, and each result is rounded once to its dtype, the numerics of the CUDA kernels (f32
// compute, one rounding per result), not their speed. Ops that only move bytes, and the conversion
// and constant ops, handle bf16 themselves.
#pragma once

#include "engine/dispatch.h"
#include "kernels/cpu/elementwise.h"

namespace autosp::cpu_ops {

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
Tensor add_layernorm(const KernelCall& c);
Tensor add_rmsnorm(const KernelCall& c);
Tensor bias_gelu_tanh(const KernelCall& c);
Tensor bias_gelu_tanh_backward(const KernelCall& c);

// Whether `c` runs through bf16_via_f32: its op computes and a bf16 tensor is among its inputs or
// its output.
bool emulates_bf16(const KernelCall& c);
// `f32_launcher` on `c`'s inputs widened to f32, each result rounded once to its node's dtype and
// placed where the memory plan put it.
Tensor bf16_via_f32(const KernelCall& c, KernelFn f32_launcher);

}  // namespace autosp::cpu_ops
