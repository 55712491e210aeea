// The kinds and constants both kernel backends take (kernels/cpu and kernels/cuda), so neither
// includes the other: the elementwise op kinds, the ignored label, the tiled MLP's and tiled
// loss's chunks, Llama's rope_scaling. Enums, constants and host arithmetic; knows nothing of
// graphs, tensors or devices.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tensor/check.h"

namespace autosp::kernels {

// unary: y[i] = f(x[i]); `scale` multiplies by a scalar. binary: broadcasting elementwise ops.
enum class Unary { neg, exp, log, tanh, sqrt, rsqrt, square, gelu_tanh, silu, scale, relu };
enum class Binary { add, sub, mul, div, max, min };
// unary_backward: dx = dy · f'(x) for the activation f.
enum class UnaryGrad { gelu_tanh, silu };

// Labels with this value are not scored (PyTorch's ignore_index).
inline constexpr int64_t kIgnoreIndex = -100;

// Rows per chunk of the tiled SwiGLU MLP (both backends run the same chunks). 1024 keeps the GEMMs
// large enough to run at full speed (M = 1024) while the scratch, 3 · 1024 · I elements, stays a
// few MB for Llama-sized I and is independent of S.
inline constexpr int64_t kMlpChunkRows = 1024;

// The tiled head + loss's chunk of rows (both backends run the same chunks): logits elements a
// chunk may hold (256 MiB in f32: 523 rows of Llama 3's 128,256 tokens), and at most
// kLinearCeChunkRows rows (a small vocabulary's chunk stays small). Each chunk's GEMMs pack all of
// w again, so fewer rows cost time: at 65 rows of 128,256 (a 32 MiB chunk) the tiny Llama's step
// took 2.6x as long as with 523 (docs/performance.md, 2026-12-02).
inline constexpr int64_t kLinearCeChunkElems = int64_t(1) << 26;
inline constexpr int64_t kLinearCeChunkRows = 4096;
inline int64_t linear_ce_chunk_rows(int64_t rows, int64_t V) {
  AUTOSP_ASSERT(rows >= 0 && V > 0, "linear_cross_entropy rows ", rows, " V ", V);
  return std::max<int64_t>(1, std::min({rows, kLinearCeChunkRows, kLinearCeChunkElems / V}));
}
// The scratch a chunk's logits take, in elements.
inline int64_t linear_ce_scratch_elems(int64_t rows, int64_t V) { return linear_ce_chunk_rows(rows, V) * V; }

// Hugging Face's rope_scaling (transformers 4.44 modeling_rope_utils), which only changes inv_freq:
//   linear: inv_freq / factor (position interpolation);
//   llama3: wavelen = 2π / inv_freq; wavelengths longer than original_max_position_embeddings /
//           low_freq_factor are divided by factor, shorter than original / high_freq_factor kept,
//           and the band between blends the two with s = (original / wavelen − low) / (high − low):
//           (1 − s)·inv_freq / factor + s·inv_freq.
// Both keep attention_factor 1, so cos and sin are not rescaled.
struct RopeScaling {
  enum Kind { none, linear, llama3 } kind = none;
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4, original_max_position_embeddings = 8192;
};

// inv_freq[i] = 1 / theta^(2i/D) for i < D/2, then `scaling`, in Hugging Face's order of operations
// in A (float: bit for bit as its float32 buffer; double: every step in double). Host code, shared
// by the CPU kernel and the CUDA launcher (which uploads it): kernels/rope_freq.cpp.
template <class A>
void rope_inv_freq(A* inv_freq, int64_t D, double theta, const RopeScaling& scaling);

}  // namespace autosp::kernels
