// What the dispatcher (engine/dispatch.cpp) reaches in the two launcher files: each device's
// launcher table, and on the CPU the bf16 emulation around it and the kernels' planned scratch.
// The launchers themselves, one per op, are written once in engine/launchers.inc.h, which
// engine/cpu/launchers.cpp (cpu_ops, the reference) and engine/cuda/launchers.cpp (cuda_ops,
// compiled only in CUDA builds) each compile with their device's kernels; a new op adds its row
// and launcher there and nothing here.
#pragma once

#include "engine/dispatch.h"

namespace autosp {
// A row of a device's launcher table (engine/launchers.inc.h): the op and its launcher.
struct LauncherRow {
  Op op;
  KernelFn run;
};
}  // namespace autosp

namespace autosp::cpu_ops {
// The CPU launcher of `op` (its row of the table).
KernelFn launcher(Op op);

// bf16 on the CPU is emulated: whether `c` runs through bf16_via_f32 (its op computes, ops.h:
// Numerics::computes, and a bf16 tensor is among its inputs or its output), and `f32_launcher` on
// `c`'s inputs widened to f32, each result rounded once to its node's dtype and placed where the
// memory plan put it: the numerics of the CUDA kernels (f32 compute, one rounding per result), not
// their speed.
bool emulates_bf16(const KernelCall& c);
Tensor bf16_via_f32(const KernelCall& c, KernelFn f32_launcher);

// The launcher that computes a bf16 node `c` without whole f32 copies instead, where there is one
// for its op and dtypes: the GEMM-bound ops on the CPU's bf16 GEMM (kernels/cpu/matmul.h:
// bf16_gemm_best, where it beats widening), same-shape elementwise ops in widened chunks; else
// nullptr (then it is emulated).
KernelFn native_bf16(const KernelCall& c);
// Whether node `n`'s op has such a launcher on this machine (a GEMM-bound one only where the bf16
// GEMM beats widening; the attention ops only at a head dim the bf16 attention takes where it is
// faster, kernels/cpu/attention.h sdpa_bf16_preferred, when the head dim is a constant). Its
// launcher may still emulate a call it cannot take (a backward whose o is not bf16).
bool has_native_bf16(const Node& n);

// The CPU sdpa_backward's partial dK, dV (kernels/cpu/attention.h), in bytes of its compute type
// (f32 for bf16 nodes, which run through bf16_via_f32).
size_t sdpa_backward_workspace(const Node& n, const Bindings& b);

// The [rows, V] logits chunk the tiled head + loss wants as workspace (kernels/cpu/loss.h), in
// bytes of its compute type.
size_t linear_cross_entropy_workspace(const Node& n, const Bindings& b);
}  // namespace autosp::cpu_ops

namespace autosp::cuda_ops {
// The CUDA launcher of `op` (CUDA builds only).
KernelFn launcher(Op op);
}  // namespace autosp::cuda_ops
