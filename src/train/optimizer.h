// Optimisation: AdamW with PyTorch semantics (decoupled weight decay on tensors of rank >= 2 only),
// global-norm gradient clipping like torch.nn.utils.clip_grad_norm_, and the learning-rate schedule
// (linear warmup, then cosine decay to min_lr). Works on ParamMaps on the host or all on one CUDA
// device (then through device/cuda/optim.h); knows nothing of graphs.
#pragma once

#include "config/config.h"
#include "tensor/tensor.h"

namespace autosp {

// Learning rate of step `step` (0-based) of `total_steps`:
//   step < warmup: lr·(step+1)/warmup; else min_lr + ½(lr − min_lr)(1 + cos(π·progress)),
//   progress = min(1, (step − warmup) / max(1, total_steps − warmup)).
double lr_at(const TrainConfig& t, int64_t step, int64_t total_steps);

// Global L2 norm of all gradients (accumulated in double).
double global_grad_norm(const ParamMap& grads);
// Scales every gradient by max_norm / (norm + 1e-6) when that is < 1 (no-op for max_norm = 0).
void clip_grads(ParamMap& grads, double norm, double max_norm);

struct AdamW {
  ParamMap exp_avg, exp_avg_sq;  // first and second moments, by parameter name
  int64_t step = 0;              // number of updates done

  void init(const ParamMap& params);  // zero moments
  // One update of every parameter with learning rate `lr`.
  void update(ParamMap& params, const ParamMap& grads, const TrainConfig& t, double lr);
};

}  // namespace autosp
