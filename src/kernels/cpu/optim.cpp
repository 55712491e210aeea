// CPU AdamW step with PyTorch's semantics (torch.optim.AdamW, amsgrad=False, the single-tensor
// path). Knows nothing of graphs.
//
// Per element, in double whatever T is, in PyTorch's order:
//   p ← p · (1 - lr·wd);  m ← β1·m + (1 - β1)·g;  v ← β2·v + (1 - β2)·g²
//   p ← p - (lr / (1 - β1^t)) · m / (√v / √(1 - β2^t) + eps)
// p, m, v are rounded to T once at the end. Elements are independent: runs of kRun elements split
// over OpenMP threads, each a flat loop vectorised for the running CPU.
#include "kernels/cpu/optim.h"

#include <algorithm>
#include <cmath>

#include "tensor/check.h"

namespace autosp::cpu {

namespace {

struct AdamWScalars {
  double beta1, beta2, eps, decay, step_size, bc2_sqrt;
};

// One run of n elements. The f32 instance is compiled per ISA (target_clones; AVX-512 takes 8
// doubles a register): this file is built with -fno-math-errno so that GCC vectorises the sqrt
// (v ≥ 0 here, so errno would never be set anyway).
template <class T>
[[gnu::always_inline]] inline void adamw_run(T* p, const T* g, T* m, T* v, int64_t n, const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    const double gi = double(g[i]);
    const double mi = s.beta1 * double(m[i]) + (1.0 - s.beta1) * gi;
    const double vi = s.beta2 * double(v[i]) + (1.0 - s.beta2) * gi * gi;
    const double denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    p[i] = T(double(p[i]) * s.decay - s.step_size * mi / denom);
    m[i] = T(mi);
    v[i] = T(vi);
  }
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void adamw_run_f32(float* p, const float* g, float* m,
                                                                               float* v, int64_t n,
                                                                               const AdamWScalars& s) {
  adamw_run(p, g, m, v, n, s);
}
void adamw_run_any(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  adamw_run_f32(p, g, m, v, n, s);
}
void adamw_run_any(double* p, const double* g, double* m, double* v, int64_t n, const AdamWScalars& s) {
  adamw_run(p, g, m, v, n, s);
}

constexpr int64_t kRun = 1 << 14;  // elements per task

}  // namespace

template <class T>
void adamw_step(T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1, double beta2, double eps,
                double weight_decay, int64_t step) {
  AUTOSP_ASSERT(n >= 0 && step >= 1, "adamw n ", n, " step ", step);
  const AdamWScalars s{beta1, beta2, eps, 1.0 - lr * weight_decay, lr / (1.0 - std::pow(beta1, double(step))),
                       std::sqrt(1.0 - std::pow(beta2, double(step)))};
#pragma omp parallel for schedule(static) if (n > 2 * kRun)
  for (int64_t i = 0; i < n; i += kRun) adamw_run_any(p + i, g + i, m + i, v + i, std::min(kRun, n - i), s);
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, double, double, double, double,
                                double, int64_t);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, double, double, double,
                                 double, double, int64_t);

}  // namespace autosp::cpu
