// TRL's DPO loss of one pair and of a table of pairs, shared by the CPU and CUDA kernels of
// preference training (kernels/cpu/preference.h, kernels/cuda/preference.cuh): plain arithmetic in
// double, compiled for the host and, under nvcc, for the device too. Knows nothing of graphs.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define AUTOSP_DPO_FN __host__ __device__ inline
#else
#define AUTOSP_DPO_FN inline
#endif

namespace autosp::kernels {

// The loss's attributes (dpo_loss's: TRL's DPOConfig beta, loss_type, label_smoothing, rpo_alpha).
struct DpoArgs {
  double beta = 0.1;
  bool ipo = false;  // loss_type "ipo" (on length-averaged log-probabilities), else "sigmoid"
  double label_smoothing = 0, rpo_alpha = 0;
  double share = 1;  // the factor on the whole loss (1/P under sequence parallelism)
};

// One pair: its loss, the loss's derivative in z, and the weights z puts on the chosen and the
// rejected sums (1, or 1 / completion tokens for IPO).
struct DpoPair {
  double loss, dz, wc, wr;
};

// From the policy's (pc, pr) and the reference's (rc, rr) sums of the chosen and rejected
// completions of nc and nr tokens: z = (pc·wc − pr·wr) − (rc·wc − rr·wr), and
// −(1 − ε) log σ(βz) − ε log σ(−βz) (sigmoid) or (z − 1/(2β))² (IPO).
AUTOSP_DPO_FN DpoPair dpo_pair(double pc, double pr, double rc, double rr, double nc, double nr, const DpoArgs& a) {
  const double wc = a.ipo ? 1 / nc : 1, wr = a.ipo ? 1 / nr : 1, beta = a.beta, eps = a.label_smoothing;
  const double z = (pc * wc - pr * wr) - (rc * wc - rr * wr);
  if (a.ipo) return {(z - 1 / (2 * beta)) * (z - 1 / (2 * beta)), 2 * (z - 1 / (2 * beta)), wc, wr};
  const double x = beta * z;
  const double log_sig = fmin(x, 0.0) - log1p(exp(-fabs(x)));    // log σ(x)
  const double log_sig_neg = fmin(-x, 0.0) - log1p(exp(-fabs(x)));  // log σ(−x)
  const double sig = 1 / (1 + exp(-x)), sig_neg = 1 / (1 + exp(x));  // σ(x), σ(−x)
  return {-(1 - eps) * log_sig - eps * log_sig_neg, -(1 - eps) * beta * sig_neg + eps * beta * sig, wc, wr};
}

// dpo_loss over the table: policy, reference, tokens [B, 2, K] (b, side, slot; side 0 chosen, 1
// rejected; a slot with no tokens on a side holds no pair), norms [2] (the step's pairs and chosen
// completion tokens). Returns share · (the mean pair loss + rpo_alpha · the chosen completions'
// NLL per token); with `dpolicy` also writes its gradient times `grad` (0 on empty slots). The
// pairs are visited in order, so the CPU kernel and the CUDA kernel's one thread agree.
template <class T>
AUTOSP_DPO_FN double dpo_table(const T* policy, const T* reference, const T* tokens, const T* norms, int64_t B,
                               int64_t K, const DpoArgs& a, T* dpolicy, double grad) {
  const double pairs = double(norms[0]), chosen_tokens = double(norms[1]);
  const double rpo_grad = a.rpo_alpha != 0 ? -a.rpo_alpha / chosen_tokens : 0;
  double pair_losses = 0, chosen_logps = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t c = b * 2 * K + k, r = c + K;  // the chosen and rejected sequence of slot k
      const double nc = double(tokens[c]), nr = double(tokens[r]);
      if (dpolicy) dpolicy[c] = dpolicy[r] = T(0);
      if (nc <= 0 || nr <= 0) continue;  // no pair in this slot
      const DpoPair p = dpo_pair(double(policy[c]), double(policy[r]), double(reference[c]), double(reference[r]),
                                 nc, nr, a);
      pair_losses += p.loss;
      chosen_logps += double(policy[c]);
      if (dpolicy) {
        dpolicy[c] = T(grad * a.share * (p.dz * p.wc / pairs + rpo_grad));
        dpolicy[r] = T(grad * a.share * (-p.dz * p.wr / pairs));
      }
    }
  const double rpo = a.rpo_alpha != 0 ? a.rpo_alpha * -chosen_logps / chosen_tokens : 0;
  return a.share * (pair_losses / pairs + rpo);
}

}  // namespace autosp::kernels
