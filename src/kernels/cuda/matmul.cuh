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
#include "kernels/cuda/elementwise.cuh"

namespace autosp::cuda {

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, double alpha, const T* a,
                  int64_t stride_a, const T* b, int64_t stride_b, double beta, T* c, int64_t stride_c,
                  cudaStream_t stream);

// One GEMM (batch 1) with bf16 A and B and an f32 C: C = alpha · op(A) · op(B) + beta · C, the
// product accumulated in f32 and added to C in f32, never rounded to bf16 (cuBLASLt's bf16 × bf16
// → f32 mode). What a sum over many GEMMs needs (ChunkedGradient below).
void gemm_bf16_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const bf16* a,
                   const bf16* b, double beta, float* c, cudaStream_t stream);

// A weight gradient summed over chunks of rows (the tiled MLP and the tiled head + loss):
// dw [M, N] = Σ over chunks of op(A_c) · op(B_c). For bf16 the running sum lives in an f32 buffer
// `acc` (M·N floats, the caller's scratch) and is rounded into dw once, by finish(): summing in a
// bf16 dw would round once more per chunk (128 chunks of the MLP at S = 128k), a few percent of
// error where one GEMM has about 0.2%. float and double sum in dw itself (acc unused, may be null).
template <class T>
struct ChunkedGradient {
  T* dw;
  float* acc;
  int64_t M, N;
  bool started = false;

  // dw (+)= op(a) · op(b) over K rows of this chunk; the first call overwrites.
  void add(bool trans_a, bool trans_b, int64_t K, const T* a, const T* b, cudaStream_t stream) {
    const double beta = started ? 1.0 : 0.0;
    started = true;
    if constexpr (std::is_same_v<T, bf16>)
      gemm_bf16_f32(trans_a, trans_b, M, N, K, 1.0, a, b, beta, acc, stream);
    else
      gemm_batched<T>(trans_a, trans_b, 1, M, N, K, 1.0, a, 0, b, 0, beta, dw, 0, stream);
  }
  // dw = the sum (zeros when no chunk was added).
  void finish(cudaStream_t stream) {
    if (!started) {
      CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(M * N) * sizeof(T), stream));
      return;
    }
    if constexpr (std::is_same_v<T, bf16>) cast<float, bf16>(acc, dw, M * N, stream);
  }
  // Floats of scratch `acc` a ChunkedGradient<T> of [M, N] needs.
  static int64_t acc_elems(int64_t M, int64_t N) { return std::is_same_v<T, bf16> ? M * N : 0; }
};

// The cuBLASLt handle of the current device, created on first use and kept for the process. Each
// (device, stream) pair gets its own workspace (kGemmWorkspaceBytes), so GEMMs on different
// streams never share one.
cublasLtHandle_t lt_handle();
inline constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

}  // namespace autosp::cuda
