// CUDA cross-entropy launchers, forward (a device scalar) and backward. The same operations as
// kernels/cpu/loss.h, over device pointers, enqueued on `stream`: no host synchronisation.
// Knows nothing of graphs.
//
// logits, dlogits [rows, V] contiguous, labels [rows] int64; a label equal to ignore_index
// contributes nothing. T is float, double or bf16; scalars (the loss, its gradient, the count) are
// acc_t<T> (float for float and bf16, double for double): a bf16 model reports an f32 loss, as
// PyTorch's autocast does for cross_entropy.
// Labels are validated by the caller (the runtime checks them on the host, as the CPU kernel does);
// a label outside [0, V) that is not ignore_index makes the loss NaN instead of reading out of bounds.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/kinds.h"

namespace autosp::cuda {

using kernels::kIgnoreIndex;

// *loss (device) = Σ over valid rows of (logsumexp(logits[r]) - logits[r, label[r]]). Each row is
// reduced by one block, the row losses are summed by one block in row order (in double):
// deterministic.
template <class T>
void cross_entropy_sum(const T* logits, const int64_t* labels, acc_t<T>* loss, int64_t rows, int64_t V,
                       int64_t ignore_index, cudaStream_t stream);

// *count (device) = number of labels that are not ignore_index (exact). C is float or double.
template <class C>
void count_valid(const int64_t* labels, int64_t n, int64_t ignore_index, C* count, cudaStream_t stream);

// dlogits[r, :] = g · (softmax(logits[r, :]) - onehot(label[r])) for valid rows, 0 for ignored rows;
// g = *grad (device scalar: the gradient of the summed loss). dlogits may alias logits.
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* labels, T* dlogits, int64_t rows, int64_t V,
                            const acc_t<T>* grad, int64_t ignore_index, cudaStream_t stream);

// The same with each row's own gradient: g = row_grads[r] (preference training's per-sequence sums).
template <class T>
void cross_entropy_backward_rows(const T* logits, const int64_t* labels, T* dlogits, int64_t rows, int64_t V,
                                 const acc_t<T>* row_grads, int64_t ignore_index, cudaStream_t stream);

// The tiled head + loss's row pass over one chunk of logits [rows, V]: row_loss[r] is row r's
// term of cross_entropy_sum (0 when ignored, NaN for a label outside [0, V)), predictions[r] its
// argmax (first maximum). One block per row.
template <class T>
void linear_ce_rows(const T* logits, const int64_t* labels, double* row_loss, int64_t* predictions, int64_t rows,
                    int64_t V, int64_t ignore_index, cudaStream_t stream);
// Gemma's final softcap on n logits in place (the tiled loss's chunk): x = c · tanh(x · (1/c)), c > 0.
template <class T>
void cap_logits(T* logits, int64_t n, double softcap, cudaStream_t stream);
// *loss (device) = Σ row_loss[0, rows), one block in a fixed order (0 for no rows). A is float or double.
template <class A>
void sum_row_losses(const double* row_loss, int64_t rows, A* loss, cudaStream_t stream);

// The tiled head + loss's backward: x [rows, C], w [V, C] → dx [rows, C] and dw [V, C]
// (overwritten). Per chunk of `chunk` rows: the logits x_c·wᵀ again into `logits` (scratch
// [chunk, V]), dlogits in place (cross_entropy_backward with g = *grad), dx_c = dlogits·w, and
// dw += dlogitsᵀ·x_c, summed over the chunks by matmul.cuh's ChunkedGradient (in f32 for bf16:
// `acc` holds ChunkedGradient<T>::acc_elems(V, C) floats, null when that is 0). dw null (a frozen
// head): only dx. softcap c > 0: each chunk is capped (cap_logits) and dlogits carry the cap's
// derivative 1 − (capped / c)².
template <class T>
void linear_cross_entropy_backward(const T* x, const T* w, const int64_t* labels, const acc_t<T>* grad, T* dx, T* dw,
                                   int64_t rows, int64_t C, int64_t V, int64_t chunk, int64_t ignore_index, T* logits,
                                   float* acc, cudaStream_t stream, double softcap = 0);

}  // namespace autosp::cuda
