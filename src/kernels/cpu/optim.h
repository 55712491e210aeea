// CPU optimizer kernels. Knows nothing of graphs.
#pragma once

#include <cstdint>

namespace autosp::cpu {

// One AdamW step with PyTorch semantics (torch.optim.AdamW, amsgrad=False), `step` counting from 1:
//   p -= lr · weight_decay · p
//   m = beta1 · m + (1 - beta1) · g;  v = beta2 · v + (1 - beta2) · g²
//   p -= (lr / (1 - beta1^step)) · m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// p, m, v are updated in place; `weight_decay` is 0 for tensors that do not decay.
template <class T>
void adamw_step(T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1, double beta2, double eps,
                double weight_decay, int64_t step);

}  // namespace autosp::cpu
