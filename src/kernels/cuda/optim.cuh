// CUDA optimizer kernels: the fused AdamW step. Knows nothing of graphs.
#pragma once

#include "kernels/cuda/common.cuh"

namespace autosp::cuda {

// One AdamW step with PyTorch semantics (torch.optim.AdamW, amsgrad=False), `step` counting from 1,
// fused into one pass over memory:
//   g = g · (*grad_scale)   (grad_scale: optional device scalar, e.g. the clipping coefficient)
//   p -= lr · weight_decay · p
//   m = beta1 · m + (1 - beta1) · g;  v = beta2 · v + (1 - beta2) · g²
//   p -= (lr / (1 - beta1^step)) · m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// p, m, v (the fp32 master state; double is also instantiated) are updated in place. G, the
// gradient, is P or bf16. p_copy (optional) receives p rounded to bf16 for the compute copy of
// the weights. Arithmetic in P (float for float, like PyTorch's fused CUDA AdamW).
template <class P, class G>
void adamw_step(P* p, const G* g, P* m, P* v, bf16* p_copy, int64_t n, double lr, double beta1, double beta2,
                double eps, double weight_decay, int64_t step, const float* grad_scale, cudaStream_t stream);

}  // namespace autosp::cuda
