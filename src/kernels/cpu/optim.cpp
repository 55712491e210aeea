// CPU AdamW step with PyTorch's semantics (torch.optim.AdamW, amsgrad=False, the single-tensor
// path). Knows nothing of graphs.
//
// Per element, in double whatever T is, in PyTorch's order:
//   p ← p · (1 - lr·wd);  m ← β1·m + (1 - β1)·g;  v ← β2·v + (1 - β2)·g²
//   p ← p - (lr / (1 - β1^t)) · m / (√v / √(1 - β2^t) + eps)
// p, m, v are rounded to T once at the end. Elements are independent: a flat loop split over
// OpenMP threads.
#include "kernels/cpu/optim.h"

#include <cmath>

#include "tensor/check.h"

namespace autosp::cpu {

template <class T>
void adamw_step(T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1, double beta2, double eps,
                double weight_decay, int64_t step) {
  AUTOSP_ASSERT(n >= 0 && step >= 1, "adamw n ", n, " step ", step);
  const double decay = 1.0 - lr * weight_decay;
  const double step_size = lr / (1.0 - std::pow(beta1, double(step)));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, double(step)));
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const double gi = double(g[i]);
    const double mi = beta1 * double(m[i]) + (1.0 - beta1) * gi;
    const double vi = beta2 * double(v[i]) + (1.0 - beta2) * gi * gi;
    const double denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = T(double(p[i]) * decay - step_size * mi / denom);
    m[i] = T(mi);
    v[i] = T(vi);
  }
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, double, double, double, double,
                                double, int64_t);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, double, double, double,
                                 double, double, int64_t);

}  // namespace autosp::cpu
