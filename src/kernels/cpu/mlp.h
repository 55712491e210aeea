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

#include "kernels/kinds.h"  // kMlpChunkRows (the CUDA launcher runs the same chunks)

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

}  // namespace autosp::cpu
