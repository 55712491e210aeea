// CPU GEMM launchers over raw pointers (OpenBLAS). Knows nothing of graphs or tensors.
//
// Row-major throughout. For b in [0, batch):
//   C[b] (M×N) = alpha · op(A[b]) · op(B[b]) + beta · C[b]
// where op(A) is M×K (A stored K×M when trans_a) and op(B) is K×N (B stored N×K when trans_b).
// A[b] starts at a + b·stride_a; a stride of 0 broadcasts that operand over the batch.
#pragma once

#include <cstdint>

namespace autosp::cpu {

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, T alpha,
                  const T* a, int64_t stride_a, const T* b, int64_t stride_b, T beta, T* c,
                  int64_t stride_c);

// Number of threads used by OpenMP regions and OpenBLAS (0 = leave as is).
void set_num_threads(int threads);
int num_threads();

}  // namespace autosp::cpu
