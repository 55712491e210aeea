// CPU rotary position embedding, rotate-half form (Hugging Face Llama). Knows nothing of graphs.
//
// x, y [B, N, S, D] contiguous (D even), position_ids [B, S] int64.
// inv_freq[i] = 1 / theta^(2i/D) for i < D/2 (then rope_scaling, below); angle = pos · inv_freq[i mod D/2];
// y = x·cos(angle) + rotate_half(x)·sin(angle), rotate_half(x) = cat(-x[D/2:], x[:D/2]).
// For T = float every step is computed in float, in the same order as Hugging Face, so results
// match PyTorch's float32 model; for T = double everything is double. x and y may not alias.
#pragma once

#include <cstdint>

namespace autosp::cpu {

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

// inv_freq[i] for i < D/2, in Hugging Face's order of operations in A (float: bit for bit as its
// float32 buffer; double: every step in double). The CUDA kernel uses it too.
template <class A>
void rope_inv_freq(A* inv_freq, int64_t D, double theta, const RopeScaling& scaling);

template <class T>
void rope_forward(const T* x, const int64_t* position_ids, T* y, int64_t B, int64_t N, int64_t S,
                  int64_t D, double theta, const RopeScaling& scaling = {});

// Backward of rope_forward: the rotation is orthogonal, so dx = rotation by -angle of dy.
template <class T>
void rope_backward(const T* dy, const int64_t* position_ids, T* dx, int64_t B, int64_t N, int64_t S, int64_t D,
                   double theta, const RopeScaling& scaling = {});

}  // namespace autosp::cpu
