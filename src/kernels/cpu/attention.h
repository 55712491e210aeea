// CPU scaled-dot-product attention (flash-style). Knows nothing of graphs.
//
// B = batch, N = query heads, Nkv = key/value heads (N % Nkv == 0, GQA: query head h reads kv head
// h / (N/Nkv)), Sq = query length, Skv = key length, D = head dim. Layouts are contiguous:
//   q [B, N, Sq, D], k, v [B, Nkv, Skv, D], o [B, N, Sq, D], lse [B, N, Sq] (optional, may be null)
// Causal means query i sees keys j ≤ i + (Skv - Sq) (bottom-right aligned; Sq == Skv in training).
// Memory is O(block · D) per thread: keys are visited in blocks with an online softmax, never an
// Sq×Skv matrix. lse[i] = log Σ_j exp(scale · q_i·k_j) over the visible keys.
// Packed documents: doc_start [B, Sq] (may be null) further keeps query i of batch b to the keys
// j ≥ doc_start[b·Sq + i] (its document's first token). Key blocks before the earliest start of a
// query block are never visited, so the cost falls from ~S²/2 to ~Σ (document length)²/2. Any
// values are safe (a row that sees no key gets o = 0, lse = -inf); nondecreasing starts skip best.
// Variants (kernels/attention_variant.h: window, softcap, sinks, a ring pair's offset): a window
// skips the key blocks before its first row's reach like a document start does, so windowed
// attention costs O(Sq · window), not O(Sq · Skv); with sinks a row that sees no key gets o = 0,
// lse = sink.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/attention_variant.h"
#include "kernels/cpu/matmul.h"  // Bf16Gemm

namespace autosp::cpu {

// The type the kernels keep the log-sum-exp in for T: T for f32 and f64, f32 for bf16 (T =
// uint16_t, raw bits: the bf16 kernels below).
template <class T>
using attention_acc_t = std::conditional_t<std::is_same_v<T, uint16_t>, float, T>;

template <class T>
void sdpa_forward(const T* q, const T* k, const T* v, T* o, T* lse, int64_t B, int64_t N, int64_t Nkv,
                  int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal, const int64_t* doc_start = nullptr,
                  const AttentionVariant<T>& var = {});

// Backward of sdpa_forward from its saved lse (FlashAttention-2 style): the probabilities are
// recomputed blockwise as P = exp(scale · q·kᵀ - lse), with Δ_i = Σ_d dout_i · o_i;
//   dv = Pᵀ · dout,  dP = dout · vᵀ,  dS = P ∘ (dP - Δ),  dq = scale · dS · k,  dk = scale · dSᵀ · q.
// GQA: dk, dv of a kv head sum over the query heads that read it. Never allocates Sq×Skv;
// deterministic (no atomics). dq [B, N, Sq, D], dk, dv [B, Nkv, Skv, D] are overwritten.
// `workspace` (may be null: then the kernel allocates it) holds sdpa_backward_workspace(...)
// elements: the partial dK, dV of the query chunks that run in parallel with the last one (sized
// for var.offset = 0: a call with an offset passes none). With var.sinks and var.dsinks, dsinks [N]
// is overwritten with the sinks' gradient.
template <class T>
void sdpa_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk,
                   T* dv, int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale,
                   bool causal, const int64_t* doc_start = nullptr, T* workspace = nullptr,
                   const AttentionVariant<T>& var = {});

// The elements of sdpa_backward's workspace for these sizes (0 when it needs none); they depend on
// the sizes only, so a memory planner can place them.
int64_t sdpa_backward_workspace(int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, bool causal);

// bf16 attention on the CPU's bf16 units: q, k, v, o, dout, dq, dk, dv bf16 (raw bits), lse f32,
// the contracts of sdpa_forward and sdpa_backward. Every tile product multiplies bf16 values
// and accumulates in f32, on `path`: AMX tiles (TDPBF16PS; amx_emulated: the same code on the
// software tiles, for tests) or AVX512-BF16 (vdpbf16ps); sdpa_bf16_path() is AMX where the bf16
// GEMM runs there (kernels/cpu/matmul.h bf16_gemm_best, so AUTOSP_BF16_GEMM caps it too), else
// AVX512-BF16. The probabilities P (and the backward's dS) are rounded to bf16 once, where a
// product reads them, as PyTorch's bf16 flash attention does; the softmax, lse and the
// accumulators of o, dq, dk, dv are f32, each output rounded once. Needs sdpa_bf16_native(D):
// AVX512-BF16 (for the packing's conversions; every CPU with AMX has it) and an even head dim.
// The backward's workspace (may be null) holds sdpa_backward_bf16_workspace(...) floats: the
// chunks' f32 dK, dV, the last chunk's included.
// The outputs (o; dq, dk, dv) are in O: bf16 (uint16_t: sdpa's outputs) or f32 (float: the
// accumulators unrounded, as ring attention sums its chunk pairs' results, rounding them once at
// the end as one process does; the values are those bf16 outputs before their rounding, and the
// backward's last chunk accumulates in dk, dv themselves, so a workspace of that size is ample).
bool sdpa_bf16_native(int64_t D);
// Whether bf16 attention at head dim D should run on these kernels rather than on the f32 ones on
// widened copies (what the dispatch asks, engine/cpu/launchers.cpp): sdpa_bf16_native(D) and D ≥
// 32. Below 32 the f32 kernels' transposed small-head-dim tiles (decision 230) beat the bf16 tile
// products, whose depth D is then one or two pair steps (decision 248: at D = 16, fwd + bwd, 740
// against 572 ms for sdpa and 748 against 558 for a ring of 2; at D = 32, 314 against 523).
bool sdpa_bf16_preferred(int64_t D);
Bf16Gemm sdpa_bf16_path();
template <class O>
void sdpa_forward_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, O* o, float* lse, int64_t B,
                       int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal,
                       const int64_t* doc_start = nullptr, const AttentionVariant<float>& var = {},
                       Bf16Gemm path = sdpa_bf16_path());
template <class O>
void sdpa_backward_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* o, const float* lse,
                        const uint16_t* dout, O* dq, O* dk, O* dv, int64_t B, int64_t N, int64_t Nkv, int64_t Sq,
                        int64_t Skv, int64_t D, double scale, bool causal, const int64_t* doc_start = nullptr,
                        float* workspace = nullptr, const AttentionVariant<float>& var = {},
                        Bf16Gemm path = sdpa_bf16_path());
int64_t sdpa_backward_bf16_workspace(int64_t B, int64_t N, int64_t Nkv, int64_t Sq, int64_t Skv, int64_t D, bool causal);

// Ring attention's merge of two partial attentions over disjoint key sets by their log-sum-exp:
// rows of (o [rows, D], lse [rows]) become the attention over both key sets,
//   lse' = log(e^lse + e^lse_blk),  o' = o · e^(lse - lse') + o_blk · e^(lse_blk - lse').
// A row with lse_blk = -inf (it saw no key of the block) is left as it is. T is f32 or f64 (a bf16
// ring's blocks come from sdpa_forward_bf16 in f32, merged into an f32 running attention).
template <class T>
void merge_attention(T* o, T* lse, const T* o_blk, const T* lse_blk, int64_t rows, int64_t D);

// y = x with entries j > i + (Skv - Sq) of each [Sq, Skv] matrix set to `value` (x [batch, Sq, Skv]);
// the mask of composite (matmul → softmax → matmul) attention. x and y may alias.
template <class T>
void causal_mask(const T* x, T* y, int64_t batch, int64_t Sq, int64_t Skv, T value);

}  // namespace autosp::cpu
