// CUDA AdamW step with PyTorch's semantics (torch.optim.AdamW, amsgrad=False). Knows nothing of
// graphs.
//
// One thread per element (grid-stride), in PyTorch's order:
//   p ← p · (1 - lr·wd);  m ← β1·m + (1 - β1)·g;  v ← β2·v + (1 - β2)·g²
//   p ← p - (lr / (1 - β1^t)) · m / (√v / √(1 - β2^t) + eps)
// The step-dependent factors are computed once on the host in double. Elements are independent,
// so the result does not depend on the launch shape.
#include "kernels/cuda/optim.cuh"

#include <cmath>

namespace autosp::cuda {

// ==== kernels ===================================================================================

namespace {

constexpr int kBlock = 256;

template <class P, class G>
__global__ void adamw_kernel(P* p, const G* g, P* m, P* v, bf16* p_copy, int64_t n, P decay, P beta1, P beta2,
                             P step_size, P bc2_sqrt, P eps, const float* grad_scale) {
  const P gs = grad_scale != nullptr ? P(*grad_scale) : P(1);
  AUTOSP_GRID_STRIDE(i, n) {
    const P gi = P(to_acc(g[i])) * gs;
    const P mi = beta1 * m[i] + (P(1) - beta1) * gi;
    const P vi = beta2 * v[i] + (P(1) - beta2) * gi * gi;
    const P denom = dsqrt(vi) / bc2_sqrt + eps;
    const P pi = p[i] * decay - step_size * mi / denom;
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (p_copy != nullptr) p_copy[i] = from_acc<bf16>(pi);
  }
}

}  // namespace

// ==== launchers =================================================================================

template <class P, class G>
void adamw_step(P* p, const G* g, P* m, P* v, bf16* p_copy, int64_t n, double lr, double beta1, double beta2,
                double eps, double weight_decay, int64_t step, const float* grad_scale, cudaStream_t stream) {
  AUTOSP_ASSERT(n >= 0 && step >= 1, "adamw n ", n, " step ", step);
  if (n == 0) return;
  const double decay = 1.0 - lr * weight_decay;
  const double step_size = lr / (1.0 - std::pow(beta1, double(step)));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, double(step)));
  launch_kernel(adamw_kernel<P, G>, grid_for(n, kBlock), kBlock, 0, stream, p, g, m, v, p_copy, n, P(decay), P(beta1),
                P(beta2), P(step_size), P(bc2_sqrt), P(eps), grad_scale);
}

template void adamw_step<float, float>(float*, const float*, float*, float*, bf16*, int64_t, double, double, double,
                                       double, double, int64_t, const float*, cudaStream_t);
template void adamw_step<float, bf16>(float*, const bf16*, float*, float*, bf16*, int64_t, double, double, double,
                                      double, double, int64_t, const float*, cudaStream_t);
template void adamw_step<double, double>(double*, const double*, double*, double*, bf16*, int64_t, double, double,
                                         double, double, double, int64_t, const float*, cudaStream_t);

}  // namespace autosp::cuda
