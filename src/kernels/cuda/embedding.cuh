// CUDA embedding lookup and its deterministic backward. The same operations as
// kernels/cpu/embedding.h, over device pointers, enqueued on `stream`. Knows nothing of graphs.
//
// weight, dweight [V, C], ids [n] int64, out, dy [n, C]; T is float, double or bf16.
// Ids are validated by the caller (the runtime checks them on the host, as the CPU kernel does);
// the kernels never read outside weight: an id outside [0, V) gives a row of NaN in the forward
// and is skipped by the backward, so a bad id is loud without a device-to-host sync.
#pragma once

#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* out, int64_t n, int64_t V, int64_t C,
                       cudaStream_t stream);

// dweight [V, C] = Σ over i with ids[i] == v of dy[i, :] (overwritten, zeros for unused rows).
// Deterministic: positions are grouped by id with a stable radix sort (CUB), then each dweight
// element is summed by one thread over its positions in increasing order (acc_t<T>).
template <class T>
void embedding_backward(const T* dy, const int64_t* ids, T* dweight, int64_t n, int64_t V, int64_t C,
                        cudaStream_t stream);

}  // namespace autosp::cuda
