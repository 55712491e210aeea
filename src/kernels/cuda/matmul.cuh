// CUDA GEMM launchers over device pointers (cuBLASLt). Knows nothing of graphs or tensors.
//
// Row-major throughout, the same contract as kernels/cpu/matmul.h. For b in [0, batch):
//   C[b] (M×N) = alpha · op(A[b]) · op(B[b]) + beta · C[b]
// where op(A) is M×K (A stored K×M when trans_a) and op(B) is K×N (B stored N×K when trans_b).
// A[b] starts at a + b·stride_a; a stride of 0 broadcasts that operand over the batch. stride_c
// must be nonzero when batch > 1 (fold a sum over the batch into K instead).
// T is float (FP32 compute: no TF32, so results match the CPU to rounding), bf16 (bf16 inputs and
// output, FP32 accumulation) or double. Enqueued on `stream`.
#pragma once

#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, double alpha, const T* a,
                  int64_t stride_a, const T* b, int64_t stride_b, double beta, T* c, int64_t stride_c,
                  cudaStream_t stream);

// The cuBLASLt handle of the current device, created on first use and kept for the process. Each
// (device, stream) pair gets its own workspace (kGemmWorkspaceBytes), so GEMMs on different
// streams never share one.
cublasLtHandle_t lt_handle();
inline constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

}  // namespace autosp::cuda
