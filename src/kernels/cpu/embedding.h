// CPU embedding lookup. Knows nothing of graphs.
// weight [V, C], ids [n] int64, out [n, C]. An id outside [0, V) throws autosp::UsageError naming it.
// T is float, double or uint16_t (bf16 bits: the forward copies them; the backward reads them
// exactly and rounds each double sum to f32 and then to bf16, the bits of the f32 kernel on dy
// widened).
#pragma once

#include <cstdint>

namespace autosp::cpu {

template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* out, int64_t n, int64_t V, int64_t C);

// dweight [V, C] = Σ over i with ids[i] == v of dy[i, :] (overwritten, zeros for unused rows).
// Deterministic: positions are grouped by id, and each dweight element is summed (in double) by one
// thread in position order; work is split over (vocab rows × column blocks), never over ids.
template <class T>
void embedding_backward(const T* dy, const int64_t* ids, T* dweight, int64_t n, int64_t V, int64_t C);

}  // namespace autosp::cpu
