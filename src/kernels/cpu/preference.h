// CPU kernels of preference training (train.objective "dpo"): each sequence's summed completion
// log-probability from logits, and TRL's DPO loss over those sums. Knows nothing of graphs.
// Shapes: B rows, S positions, V vocabulary, K pair slots; a sequence table is [B, 2, K] (side 0
// the chosen sequence of slot k, side 1 its rejected one).
#pragma once

#include <cstdint>

#include "kernels/dpo.h"
#include "kernels/kinds.h"  // kIgnoreIndex

namespace autosp::cpu {

// out[b, side, k] = Σ log softmax(logits[b, t])[labels[b, t]] over the targets t with a label
// (not ignore_index) and slots[b, t] = +(k + 1) (side 0) or −(k + 1) (side 1); 0 elsewhere.
// Each row's log-probability in double, each sum in double in the order of t. A label outside
// [0, V) or a slot outside [−K, K] is a UsageError naming it.
template <class T>
void sequence_logps(const T* logits, const int64_t* labels, const int64_t* slots, T* out, int64_t B, int64_t S,
                    int64_t V, int64_t K, int64_t ignore_index = kernels::kIgnoreIndex);

// dlogits[b, t] = grad[b, side, k] · (onehot(label) − softmax(logits[b, t])) on the targets the
// forward summed into (side, k), 0 elsewhere (dlogits may alias logits).
template <class T>
void sequence_logps_backward(const T* logits, const int64_t* labels, const int64_t* slots, const T* grad, T* dlogits,
                             int64_t B, int64_t S, int64_t V, int64_t K, int64_t ignore_index = kernels::kIgnoreIndex);

// The same two on bf16 logits (uint16_t bits) with the f32 sums and gradient a bf16 graph keeps:
// each row widened once into the f32 kernel's row work (kernels/cpu/loss.h), so the bits of the f32
// kernels on the widened logits, dlogits rounded once.
void sequence_logps_bf16(const uint16_t* logits, const int64_t* labels, const int64_t* slots, float* out, int64_t B,
                         int64_t S, int64_t V, int64_t K, int64_t ignore_index);
void sequence_logps_backward_bf16(const uint16_t* logits, const int64_t* labels, const int64_t* slots,
                                  const float* grad, uint16_t* dlogits, int64_t B, int64_t S, int64_t V, int64_t K,
                                  int64_t ignore_index);

// The same sums from each row's cross entropy `row_loss` [B·S] (the tiled head's,
// linear_cross_entropy_sum's row_loss): out[b, side, k] = −Σ row_loss over those targets.
template <class T>
void slot_sums(const double* row_loss, const int64_t* labels, const int64_t* slots, T* out, int64_t B, int64_t S,
               int64_t K, int64_t ignore_index = kernels::kIgnoreIndex);

// Its backward as each row's cross-entropy gradient: row_grad[r] = −grad[b, side, k] on the targets
// slot_sums summed into (side, k), 0 elsewhere (linear_cross_entropy_backward's row_grad).
template <class T>
void slot_row_grads(const int64_t* labels, const int64_t* slots, const T* grad, double* row_grad, int64_t B, int64_t S,
                    int64_t K, int64_t ignore_index = kernels::kIgnoreIndex);

using kernels::DpoArgs;

// Over policy, reference and tokens [B, 2, K] (tokens: each sequence's completion targets; a slot is
// a pair when both its sequences have some) and norms [2] = (the step's pairs, its chosen completion
// tokens): z = (πc − πr) − (ρc − ρr) per pair (each divided by its tokens for IPO), the pair's loss
// −(1 − ε) log σ(βz) − ε log σ(−βz) (sigmoid) or (z − 1/(2β))² (IPO); returns
//   share · (Σ pair losses / norms[0] + rpo_alpha · (−Σ πc) / norms[1])
// in double. With `dpolicy` it also writes grad times that loss's gradient with respect to policy.
template <class T>
double dpo_loss(const T* policy, const T* reference, const T* tokens, const T* norms, int64_t B, int64_t K,
                const DpoArgs& args, T* dpolicy = nullptr, double grad = 0);

}  // namespace autosp::cpu
