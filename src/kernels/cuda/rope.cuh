// CUDA rotary position embedding, rotate-half form (Hugging Face Llama), forward and backward.
// The same operations and argument order as kernels/cpu/rope.h, over device pointers, enqueued on
// `stream`, the last argument (the engine's shared launcher appends it: engine/launchers.inc.h).
// Knows nothing of graphs.
//
// x, y [B, N, S, D] contiguous (D even, ≤ 256), position_ids [B, S] int64 (device).
// inv_freq[i] = 1 / theta^(2i/D), then rope_scaling (kernels/kinds.h RopeScaling); angle = pos · inv_freq[i mod D/2];
// y = x·cos(angle) + rotate_half(x)·sin(angle). T is float, double or bf16 (bf16 computes in
// float and rounds once). x and y may not alias.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/kinds.h"  // RopeScaling, rope_inv_freq

namespace autosp::cuda {

using kernels::RopeScaling;

template <class T>
void rope_forward(const T* x, const int64_t* position_ids, T* y, int64_t B, int64_t N, int64_t S, int64_t D,
                  double theta, const RopeScaling& scaling, cudaStream_t stream);

// dx = rotation of dy by -angle.
template <class T>
void rope_backward(const T* dy, const int64_t* position_ids, T* dx, int64_t B, int64_t N, int64_t S, int64_t D,
                   double theta, const RopeScaling& scaling, cudaStream_t stream);

}  // namespace autosp::cuda
