// CPU scaled-dot-product attention (flash-style). Knows nothing of graphs.
//
// B = batch, N = query heads, Nkv = key/value heads (N % Nkv == 0, GQA: query head h reads kv head
// h / (N/Nkv)), Sq = query length, Skv = key length, D = head dim. Layouts are contiguous:
//   q [B, N, Sq, D], k, v [B, Nkv, Skv, D], o [B, N, Sq, D], lse [B, N, Sq] (optional, may be null)
// Causal means query i sees keys j ≤ i + (Skv - Sq) (bottom-right aligned; Sq == Skv in training).
// Memory is O(block · D) per thread: keys are visited in blocks with an online softmax, never an
// Sq×Skv matrix. lse[i] = log Σ_j exp(scale · q_i·k_j) over the visible keys.
#pragma once

#include <cstdint>

namespace autosp::cpu {

template <class T>
void sdpa_forward(const T* q, const T* k, const T* v, T* o, T* lse, int64_t B, int64_t N, int64_t Nkv,
                  int64_t Sq, int64_t Skv, int64_t D, double scale, bool causal);

}  // namespace autosp::cpu
