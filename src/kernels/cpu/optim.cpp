// CPU AdamW step with PyTorch's semantics (torch.optim.AdamW, amsgrad=False). Knows nothing of
// graphs.
//
// Per element, in T (f32 for an f32 model, as PyTorch's and our CUDA kernel's f32 AdamW compute;
// decision 228), in the CUDA kernel's order:
//   p ← p · (1 - lr·wd);  m ← β1·m + (1 - β1)·g;  v ← β2·v + (1 - β2)·g²
//   p ← p - (lr / (1 - β1^t)) · m / (√v / √(1 - β2^t) + eps)
// The step's scalars are formed in double and rounded to T once. Elements are independent: runs of
// kRun elements split over OpenMP threads, each a flat loop vectorised for the running CPU (this
// file is built with -ffp-contract=off, so the vector body and the scalar tail round alike and an
// element's update does not depend on its position).
#include "kernels/cpu/optim.h"

#include <algorithm>
#include <cmath>

#include "tensor/check.h"

namespace autosp::cpu {

namespace {

template <class T>
struct AdamWScalars {
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, bc2_sqrt;
};

// One run of n elements. The f32 instance is compiled per ISA (target_clones; AVX-512 takes 16
// floats a register): this file is built with -fno-math-errno so that GCC vectorises the sqrt
// (v ≥ 0 here, so errno would never be set anyway).
template <class T>
[[gnu::always_inline]] inline void adamw_run(T* p, const T* g, T* m, T* v, int64_t n, const AdamWScalars<T>& s) {
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    const T mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
    const T vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
    const T denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    p[i] = p[i] * s.decay - s.step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void adamw_run_f32(float* p, const float* g, float* m,
                                                                               float* v, int64_t n,
                                                                               const AdamWScalars<float>& s) {
  adamw_run(p, g, m, v, n, s);
}
void adamw_run_any(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars<float>& s) {
  adamw_run_f32(p, g, m, v, n, s);
}
void adamw_run_any(double* p, const double* g, double* m, double* v, int64_t n, const AdamWScalars<double>& s) {
  adamw_run(p, g, m, v, n, s);
}

constexpr int64_t kRun = 1 << 14;  // elements per task

}  // namespace

template <class T>
void adamw_step(T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1, double beta2, double eps,
                double weight_decay, int64_t step) {
  AUTOSP_ASSERT(n >= 0 && step >= 1, "adamw n ", n, " step ", step);
  // As the CUDA kernel forms them: β1, β2 rounded to T, then 1 − β in T.
  const T b1 = T(beta1), b2 = T(beta2);
  const AdamWScalars<T> s{b1, T(1) - b1, b2, T(1) - b2, T(eps), T(1.0 - lr * weight_decay),
                          T(lr / (1.0 - std::pow(beta1, double(step)))), T(std::sqrt(1.0 - std::pow(beta2, double(step))))};
#pragma omp parallel for schedule(static) if (n > 2 * kRun)
  for (int64_t i = 0; i < n; i += kRun) adamw_run_any(p + i, g + i, m + i, v + i, std::min(kRun, n - i), s);
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, double, double, double, double,
                                double, int64_t);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, double, double, double,
                                 double, double, int64_t);

}  // namespace autosp::cpu
