// CPU rotary position embedding, rotate-half form (Hugging Face Llama). Knows nothing of graphs.
//
// x, y [B, N, S, D] contiguous (D even), position_ids [B, S] int64.
// inv_freq[i] = 1 / theta^(2i/D) for i < D/2 (then rope_scaling: kernels/kinds.h); angle = pos · inv_freq[i mod D/2];
// y = x·cos(angle) + rotate_half(x)·sin(angle), rotate_half(x) = cat(-x[D/2:], x[:D/2]).
// For T = float every step is computed in float, in the same order as Hugging Face, so results
// match PyTorch's float32 model; for T = double everything is double. x and y may not alias.
#pragma once

#include <cstdint>

#include "kernels/kinds.h"  // RopeScaling (Hugging Face's rope_scaling), rope_inv_freq

namespace autosp::cpu {

using kernels::RopeScaling;
using kernels::rope_inv_freq;

template <class T>
void rope_forward(const T* x, const int64_t* position_ids, T* y, int64_t B, int64_t N, int64_t S,
                  int64_t D, double theta, const RopeScaling& scaling = {});

// Backward of rope_forward: the rotation is orthogonal, so dx = rotation by -angle of dy.
template <class T>
void rope_backward(const T* dy, const int64_t* position_ids, T* dx, int64_t B, int64_t N, int64_t S, int64_t D,
                   double theta, const RopeScaling& scaling = {});

// The same two steps apart, for callers that rotate a position's rows in pieces (the bf16 chunks):
// rope_factors gives each of `positions` positions its D/2 cos and sin (times yarn's attention
// factor; the sin negated for the backward) exactly as rope_forward and rope_backward compute
// them, [positions, D/2] each; rope_apply rotates rows [rows, D] of x into y, row r by factor row
// r, with their arithmetic, so the two together give their bits.
template <class T>
void rope_factors(const int64_t* position_ids, int64_t positions, int64_t D, double theta, const RopeScaling& scaling,
                  bool backward, T* cos_f, T* sin_f);
template <class T>
void rope_apply(const T* x, const T* cos_f, const T* sin_f, T* y, int64_t rows, int64_t D);

}  // namespace autosp::cpu
