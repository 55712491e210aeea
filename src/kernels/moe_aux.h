// A mixture of experts' load-balancing loss (the ops moe_router_stats, moe_aux_loss and its
// backward): transformers' load_balancing_loss_func (Switch Transformer, eq. 4-6) split into
// per-layer statistics, which can be summed over the ranks that hold parts of a batch, and the
// loss over their sums. Host code both kernel backends use (the CUDA launchers on host copies:
// the inputs are small). Knows nothing of graphs or tensors.
//
// R = rows (tokens), E = experts, k = experts per token, L = layers.
//   stats [2, E] of one layer:  c_e = #rows whose top-k (kernels/moe_routing.h) holds e,
//                               p_e = Σ_r probs[r, e]
//   loss = share · E · Σ_e (C_e / N) · (P_e / N),  C, P summed over the L layers' stats,
//          N = Σ_e C_e / k = rows × layers
// which is transformers' torch.sum(tokens_per_expert * router_prob_per_expert) * E over the
// concatenated layers (its tokens_per_expert [k, E] summed over k is C / N). dloss / dP_e =
// share · E · C_e / N²; the counts get no gradient.
#pragma once

#include <cstdint>

namespace autosp::kernels {

// stats [2, E] from probs [R, E] (sums accumulated in double).
template <class T>
void moe_router_stats(const T* probs, int64_t R, int64_t E, int64_t k, T* stats);

// The loss over stats [L, 2, E]; with dstats, its gradient times g instead (row 0 of each layer 0).
template <class T>
double moe_aux_loss(const T* stats, int64_t L, int64_t E, int64_t k, double share, T* dstats = nullptr, double g = 0);

}  // namespace autosp::kernels
