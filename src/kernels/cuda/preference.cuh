// CUDA kernels of preference training (train.objective "dpo"): the operations of
// kernels/cpu/preference.h over device pointers, enqueued on `stream`. Knows nothing of graphs.
// A sequence table is [B, 2, K] in A = acc_t<T> (float for float and bf16 logits, double for
// double). Slots outside [−K, K] are not summed (the trainer makes them; the CPU kernel checks).
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/dpo.h"

namespace autosp::cuda {

// out [B, 2, K] = each slot's summed log-probability (kernels/cpu/preference.h sequence_logps): the
// rows' log-probabilities by the tiled loss's row pass, then one thread per table entry sums its
// rows in order (deterministic).
template <class T>
void sequence_logps(const T* logits, const int64_t* labels, const int64_t* slots, acc_t<T>* out, int64_t B,
                    int64_t S, int64_t V, int64_t K, int64_t ignore_index, cudaStream_t stream);

// dlogits [B, S, V] from grad [B, 2, K]: each row's gradient, then cross_entropy_backward_rows.
template <class T>
void sequence_logps_backward(const T* logits, const int64_t* labels, const int64_t* slots, const acc_t<T>* grad,
                             T* dlogits, int64_t B, int64_t S, int64_t V, int64_t K, int64_t ignore_index,
                             cudaStream_t stream);

// *loss (device) = dpo_loss's value (kernels/cpu/preference.h), one thread; with dpolicy non-null
// instead dpolicy [B, 2, K] = *grad times its gradient with respect to policy. A is float or double.
template <class A>
void dpo_loss(const A* policy, const A* reference, const A* tokens, const A* norms, int64_t B, int64_t K,
              const kernels::DpoArgs& args, A* loss, A* dpolicy, const A* grad, cudaStream_t stream);

}  // namespace autosp::cuda
