// The kinds and constants both kernel backends take (kernels/cpu and kernels/cuda), so neither
// includes the other: the elementwise op kinds, the ignored label, the tiled MLP's and tiled
// loss's chunks, the MoE experts' options, Llama's rope_scaling. Enums, constants and host
// arithmetic; knows nothing of graphs, tensors or devices.
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

// Dropout's mask (LoRA's lora_dropout), a counter-based hash that both backends compute alike, so
// the mask depends only on (seed, token index, feature) and never on which rank or device holds
// the token: element c of token t is kept when the top 32 bits of
//   mix64(dropout_row(seed, t) + c · golden)   (mix64: splitmix64's finaliser)
// are ≥ dropout_threshold(p) = round(p · 2^32), so P(drop) = p to 2^-32. Kept elements are scaled
// by 1 / (1 − p) (inverted dropout).
constexpr uint64_t kGolden64 = 0x9E3779B97F4A7C15ull;
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t dropout_row(uint64_t seed, int64_t token) {
  return mix64(mix64(seed) ^ (static_cast<uint64_t>(token) * kGolden64 + 0x632BE59BD9B4E019ull));
}
constexpr bool dropout_keep(uint64_t row, int64_t c, uint64_t threshold) {
  return (mix64(row + static_cast<uint64_t>(c) * kGolden64) >> 32) >= threshold;
}
inline uint64_t dropout_threshold(double p) {
  AUTOSP_ASSERT(p >= 0 && p < 1, "dropout p ", p);
  return static_cast<uint64_t>(p * 4294967296.0 + 0.5);
}

// Labels with this value are not scored (PyTorch's ignore_index).
inline constexpr int64_t kIgnoreIndex = -100;

// Rows per chunk of the tiled SwiGLU MLP (both backends run the same chunks). 1024 keeps the GEMMs
// large enough to run at full speed (M = 1024) while the scratch, 3 · 1024 · I elements, stays a
// few MB for Llama-sized I and is independent of S.
inline constexpr int64_t kMlpChunkRows = 1024;

// A mixture-of-experts expert's options beyond Mixtral's (kernels/cpu/moe.h, kernels/cuda/moe.cuh;
// gpt-oss's experts): per-expert biases, host arrays of E pointers (null: none), b_gate[e], b_up[e]
// [I] and b_down[e] [C], with a backward's gradients of them; and the activation, SwiGLU
// h = silu(g) ∘ u or gpt-oss's clamped SwiGLU
//   gc = min(g, limit), uc = clamp(u, −limit, limit), h = (uc + 1) ∘ gc ∘ σ(alpha · gc)
// (g, u: the gate and up projections with their biases; a clamp's derivative is 1 inside its
// bounds, equality included, and 0 outside, as torch.clamp's).
template <class T>
struct MoeOptions {
  const T* const* b_gate = nullptr;
  const T* const* b_up = nullptr;
  const T* const* b_down = nullptr;
  T* const* db_gate = nullptr;
  T* const* db_up = nullptr;
  T* const* db_down = nullptr;
  bool clamped = false;
  double alpha = 1.702, limit = 7.0;
  bool plain() const { return b_gate == nullptr && !clamped; }  // Mixtral's experts
};

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

// Hugging Face's rope_scaling (transformers' modeling_rope_utils), which changes inv_freq and, for
// yarn, scales cos and sin by an attention factor:
//   linear: inv_freq / factor (position interpolation);
//   llama3: wavelen = 2π / inv_freq; wavelengths longer than original_max_position_embeddings /
//           low_freq_factor are divided by factor, shorter than original / high_freq_factor kept,
//           and the band between blends the two with s = (original / wavelen − low) / (high − low):
//           (1 − s)·inv_freq / factor + s·inv_freq.
//   yarn:   (transformers 5's _compute_yarn_parameters) the correction dims
//           d(r) = D·ln(original / (2π·r)) / (2·ln theta) for r = beta_fast (32) and beta_slow (1),
//           floored / ceiled when `truncate`, clamped to [0, D − 1], give a ramp
//           m_i = clamp((i − low) / (high − low), 0, 1) over i < D/2 (high += 0.001 when equal);
//           inv_freq = (inv_freq / factor)·m_i + inv_freq·(1 − m_i); cos and sin are multiplied by
//           attention_factor (given, else mscale(factor, mscale) / mscale(factor, mscale_all_dim)
//           when both are set, else mscale(factor) with mscale(s, m) = 0.1·m·ln(s) + 1 for s > 1, 1
//           otherwise): yarn_attention_factor.
// linear and llama3 keep the attention factor 1, so cos and sin are not rescaled.
struct RopeScaling {
  enum Kind { none, linear, llama3, yarn } kind = none;
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4, original_max_position_embeddings = 8192;
  // yarn; 0 = absent (HF's defaults).
  double beta_fast = 0, beta_slow = 0, attention_factor = 0, mscale = 0, mscale_all_dim = 0;
  bool truncate = true;
};

// What cos and sin are multiplied by: 1, or yarn's attention factor as above (in double, as HF
// computes it in Python floats).
double rope_attention_factor(const RopeScaling& scaling);

// inv_freq[i] = 1 / theta^(2i/D) for i < D/2, then `scaling`, in Hugging Face's order of operations
// in A (float: bit for bit as its float32 buffer; double: every step in double). Host code, shared
// by the CPU kernel and the CUDA launcher (which uploads it): kernels/rope_freq.cpp.
template <class A>
void rope_inv_freq(A* inv_freq, int64_t D, double theta, const RopeScaling& scaling);

}  // namespace autosp::kernels
