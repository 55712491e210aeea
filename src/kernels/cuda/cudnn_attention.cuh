// cuDNN scaled-dot-product attention: forward and backward through the cuDNN 9 backend graph API
// (no cudnn-frontend: the operation graphs are built from cudnnBackend* descriptors in
// cudnn_attention.cpp), a selectable alternative to our flash attention (runtime.attention =
// "cudnn"). Plain host C++. Knows nothing of graphs.
//
// Same arguments, layouts and results as sdpa_forward / sdpa_backward in attention.cuh, so the
// dispatch can switch between them:
//   q, o, dout, dq [B, N, Sq, D], k, v, dk, dv [B, Nkv, Skv, D] (contiguous, T = bf16 or f16),
//   lse [B, N, Sq] f32 = log Σ_j exp(scale · q_i·k_j) over the keys row i sees (natural log).
// cuDNN's softmax "Stats" output is exactly that (max + log Σ exp(s - max) of the scaled, masked
// scores, f32 [B, N, Sq, 1]), so lse is written and read in place, without conversion, and a
// forward of one implementation feeds the backward of the other.
//
// Supported (cudnn_sdpa_unsupported says why not): a build with cuDNN, compute capability ≥ 8.0,
// T = bf16 or f16, D ∈ {64, 128}, N % Nkv == 0 (GQA), Sq, Skv ≥ 1, causal only with Sq == Skv
// (cuDNN's causal mask is top-left aligned; ours is bottom-right, the same when Sq == Skv), and
// cuDNN has an engine for both graphs of these sizes (checked by building both plans, so "no
// engine supports this graph" is a reason to fall back, not a failed run).
// Pointers must be 16-byte aligned. The backward is not bitwise deterministic (cuDNN accumulates
// dq in fp32 with atomics), unlike our kernels.
//
// Execution plans are built once per (device, dtype, shape, causal) and cached for the process;
// each call takes its workspace (plus the backward's fp32 dq accumulator) from the
// stream-ordered pool (cudaMallocAsync on `stream`). A cuDNN failure throws RuntimeFailure naming
// the descriptor call, the shape, cudnnGetErrorString and cudnnGetLastErrorString.
#pragma once

#include <string>

#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

// "" when cudnn_sdpa_forward / cudnn_sdpa_backward can run these sizes on the current device, else
// the reason (for a warning before falling back to sdpa_forward / sdpa_backward). T is float, bf16
// or f16 (float is never supported: cuDNN's fused attention takes 16-bit inputs).
template <class T>
std::string cudnn_sdpa_unsupported(int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, bool causal);

template <class T>
void cudnn_sdpa_forward(const T* q, const T* k, const T* v, T* o, float* lse, int64_t B, int64_t N, int64_t Nkv,
                        int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, cudaStream_t stream);

// dq, dk, dv are overwritten. `o` and `lse` are the forward's (either implementation's).
template <class T>
void cudnn_sdpa_backward(const T* q, const T* k, const T* v, const T* o, const float* lse, const T* dout, T* dq, T* dk,
                         T* dv, int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale,
                         bool causal, cudaStream_t stream);

// The cuDNN library version at run time (cudnnGetVersion, e.g. 91900), 0 in a build without cuDNN.
size_t cudnn_runtime_version();

}  // namespace autosp::cuda
