// CUDA scaled-dot-product attention (our own flash attention, forward and backward) and the causal
// mask of composite attention. The same operations as kernels/cpu/attention.h, over device
// pointers, enqueued on `stream`. Knows nothing of graphs.
//
// B = batch, N = query heads, Nkv = key/value heads (N % Nkv == 0; GQA: query head h reads kv head
// h / (N/Nkv)), Sq = query length, Skv = key length, D = head dim (≤ 128). Contiguous layouts:
//   q, o, dout, dq [B, N, Sq, D], k, v, dk, dv [B, Nkv, Skv, D], lse [B, N, Sq] (float, always)
// Causal means query i sees keys j ≤ i + (Skv - Sq) (bottom-right aligned). A query row that sees
// no key gets o = 0 and lse = -inf. T is float or bf16; all accumulation is fp32; the log-sum-exp
// is saved in fp32 whatever T is (the runtime must give sdpa's extra output dtype f32).
// Packed documents: doc_start [B, Sq] (device, may be null) further keeps query i of batch b to
// the keys j ≥ doc_start[b·Sq + i]; tiles before the earliest start of a block's rows are never
// loaded (as kernels/cpu/attention.h). Each row of doc_start must not decrease along the queries
// (packed documents: a start is where the query's document begins); the backward relies on it to
// stop a key block's dk/dv at the first query tile past its documents. Batches are checked on
// the host before they are uploaded (train/data.h check_doc_start).
//
// Two implementations, chosen per call:
//   - tensor cores (mma.sync m16n8k16 bf16, FlashAttention-2 tiling): T = bf16, D ∈ {64, 128},
//     16-byte aligned pointers, compute capability ≥ 8.0;
//   - SIMT (one warp per row, fp32 FMA): everything else — float inputs (exact fp32, no TF32),
//     other head dims — and any call with SdpaKernel::simt (a reference path for testing).
// Both are deterministic: dq is computed by its own pass over the keys (no atomics).
#pragma once

#include "kernels/attention_variant.h"
#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

enum class SdpaKernel { automatic, simt };

// Variants (kernels/attention_variant.h): the window (with var.offset when not causal) becomes
// per-row key starts, max(doc_start[i], i + shift - window + 1), which both paths already skip
// and mask by (a [B, Sq] i64 scratch). A softcap runs on the SIMT path (the tensor-core kernels do
// not take it), capping each score and folding 1 - tanh² into dS. Sinks (var.sinks [N], f32 on the
// device whatever T is) run on both paths: each finished row's online softmax takes exp(sink) into
// its denominator once, so o and the saved lse include it; the backward's dq, dk, dv read that lse
// and need nothing new, and var.dsinks [N] (f32, overwritten; null: not computed) is one pass over
// lse and Δ per head in a fixed order. An offset under causal masking has no CUDA kernel.
template <class T>
void sdpa_forward(const T* q, const T* k, const T* v, T* o, float* lse, int64_t B, int64_t N, int64_t Nkv, int64_t Sq,
                  int64_t Skv, int64_t D, double scale, bool causal, cudaStream_t stream,
                  SdpaKernel kernel = SdpaKernel::automatic, const int64_t* doc_start = nullptr,
                  const AttentionVariant<float>& var = {});

// Backward of sdpa_forward from its saved lse (FlashAttention-2): with Δ_i = Σ_d dout_i · o_i and
// P = exp(scale · q·kᵀ - lse) recomputed per tile,
//   dv = Pᵀ · dout,  dS = P ∘ (dout · vᵀ - Δ),  dq = scale · dS · k,  dk = scale · dSᵀ · q,
//   dsinks_h = -Σ_{b,i} exp(sink_h - lse_i) · Δ_i (the sink's column of dS: it attends to nothing).
// GQA: dk, dv of a kv head sum over the query heads that read it. dq, dk, dv are overwritten.
// Scratch: Δ [B, N, Sq] floats from the stream-ordered pool.
template <class T>
void sdpa_backward(const T* q, const T* k, const T* v, const T* o, const float* lse, const T* dout, T* dq, T* dk, T* dv,
                   int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal,
                   cudaStream_t stream, SdpaKernel kernel = SdpaKernel::automatic, const int64_t* doc_start = nullptr,
                   const AttentionVariant<float>& var = {});

// y = x with entries j > i + (Skv - Sq) of each [Sq, Skv] matrix set to `value` (x [batch, Sq, Skv]).
// x and y may alias. T is float, double or bf16.
// Ring attention's merge (kernels/cpu/attention.h merge_attention): rows of the running attention
// (o [rows, D], lse [rows], both f32) absorb a block's (o_blk [rows, D] in T, lse_blk [rows] f32)
// by log-sum-exp; a row with lse_blk = -inf is left as it is. One thread per row.
template <class T>
void merge_attention(float* o, float* lse, const T* o_blk, const float* lse_blk, int64_t rows, int64_t D,
                     cudaStream_t stream);

template <class T>
void causal_mask(const T* x, T* y, int64_t batch, int64_t Sq, int64_t Skv, T value, cudaStream_t stream);

}  // namespace autosp::cuda
