// Dropless top-k routing of a mixture-of-experts layer (the ops moe_experts and
// moe_experts_backward): which experts each token goes to and with what weight, grouped by expert.
// Host code both kernel backends use (the CPU kernels directly, the CUDA launchers on the router
// probabilities copied to the host). Knows nothing of graphs or tensors.
//
// R = rows (tokens), E = experts, k = experts per token. probs [R, E] are the router's softmax
// probabilities. Each row takes the k largest (ties: the lower expert index first, in descending
// order as torch.topk lists them); its weights are those probabilities, divided by their sum when
// `norm` (Mixtral always; Qwen's norm_topk_prob). No capacity: every row reaches its k experts.
#pragma once

#include <cstdint>
#include <vector>

namespace autosp::kernels {

struct MoeRouting {
  int64_t R = 0, E = 0, k = 0;
  std::vector<int32_t> expert;  // [R·k] the chosen experts of row r at r·k + j, j in top-k order
  std::vector<double> weight;   // [R·k] their weights (computed in the probabilities' type)
  std::vector<double> sum;      // [R] the sum of the k chosen probabilities (norm's divisor)
  // The assignments grouped by expert: expert e's are slot[offset[e]] .. slot[offset[e + 1] - 1],
  // each a slot r·k + j, in row order.
  std::vector<int64_t> offset;  // [E + 1]
  std::vector<int64_t> slot;    // [R·k]
  int64_t rows_of(int64_t e) const { return offset[e + 1] - offset[e]; }
  int64_t max_rows() const;     // the most rows any expert gets
};

// The routing of probs [R, E] (T = float or double; bf16 arrives as float).
template <class T>
MoeRouting moe_route(const T* probs, int64_t R, int64_t E, int64_t k, bool norm);

// dprobs [R, E] from g [R·k], the gradient of each slot's weight (g = dy · the expert's output):
// norm: dp_i = (g_i − Σ_j w_j g_j) / s for a chosen i (s = the chosen probabilities' sum), else
// dp_i = g_i; 0 for the experts a row did not choose (top-k is piecewise constant).
template <class T>
void moe_probs_grad(const MoeRouting& r, bool norm, const double* g, T* dprobs);

}  // namespace autosp::kernels
