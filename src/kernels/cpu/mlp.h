// CPU tiled SwiGLU MLP (Hugging Face Llama's MLP, no biases), forward and backward over raw
// pointers. Knows nothing of graphs or tensors.
//
// x [R, C] (R = rows = tokens, C = hidden), w_gate, w_up [I, C], w_down [C, I] (I = intermediate):
//   y = (silu(x·w_gateᵀ) ∘ (x·w_upᵀ))·w_downᵀ                                    [R, C]
// Rows are processed in chunks of kMlpChunkRows: per chunk the only scratch is three [rows, I]
// buffers, allocated per call, so no [R, I] tensor ever exists. The backward recomputes each
// chunk's gate and up projections from x and accumulates the weight gradients over the chunks in
// chunk order; the GEMMs (kernels/cpu/matmul.h) and the elementwise loops are what run in
// parallel, so results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"  // Bf16Gemm
#include "kernels/kinds.h"        // kMlpChunkRows (the CUDA launcher runs the same chunks)

namespace autosp::cpu {

using kernels::kMlpChunkRows;

template <class T>
void swiglu_mlp_forward(const T* x, const T* w_gate, const T* w_up, const T* w_down, T* y, int64_t rows, int64_t C,
                        int64_t I, int64_t chunk_rows = kMlpChunkRows);

// dy, x, dx [R, C]; dw_gate, dw_up [I, C], dw_down [C, I] (overwritten, not accumulated into).
// Per chunk: g = x_c·Wgᵀ, u = x_c·Wuᵀ, h = silu(g)∘u; dWd += dy_cᵀ·h; dh = dy_c·Wd;
// dg = dh∘u∘silu'(g), du = dh∘silu(g); dx_c = dg·Wg + du·Wu; dWg += dgᵀ·x_c; dWu += duᵀ·x_c.
template <class T>
void swiglu_mlp_backward(const T* dy, const T* x, const T* w_gate, const T* w_up, const T* w_down, T* dx, T* dw_gate,
                         T* dw_up, T* dw_down, int64_t rows, int64_t C, int64_t I,
                         int64_t chunk_rows = kMlpChunkRows);

// The same on bf16 tensors (raw uint16_t bits) with every GEMM on the CPU's bf16 GEMM `path`
// (gemm_bf16_batched: f32 accumulation). g, u, dh and the chunk's outputs are f32; what a GEMM
// reads is bf16, so h, dg and du are rounded to bf16 once (as the CUDA kernels hold them); the
// weight gradients are summed over the chunks in f32 and each output is rounded once at the end.
void swiglu_mlp_forward_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* w_gate, const uint16_t* w_up,
                             const uint16_t* w_down, uint16_t* y, int64_t rows, int64_t C, int64_t I,
                             int64_t chunk_rows = kMlpChunkRows);
void swiglu_mlp_backward_bf16(Bf16Gemm path, const uint16_t* dy, const uint16_t* x, const uint16_t* w_gate,
                              const uint16_t* w_up, const uint16_t* w_down, uint16_t* dx, uint16_t* dw_gate,
                              uint16_t* dw_up, uint16_t* dw_down, int64_t rows, int64_t C, int64_t I,
                              int64_t chunk_rows = kMlpChunkRows);

}  // namespace autosp::cpu
