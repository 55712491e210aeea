// CPU rotary position embedding, rotate-half form (Hugging Face Llama). Knows nothing of graphs.
//
// For T = float each step is float and in Hugging Face's order, so outputs match PyTorch's float32
// model: inv_freq = 1 / theta^(2i/D) (powf, then a float divide; then rope_scaling), angle = float(pos) · inv_freq,
// cosf / sinf (times yarn's attention factor, which HF applies to cos and sin), y = (x · cos) +
// (rotate_half(x) · sin). For T = double every step is double.
// Each product is rounded before the add, as in PyTorch's separate ops: the pragma below stops GCC
// from fusing them into an FMA when the target has one (its C++ default is -ffp-contract=fast).
//
// Speed: (b, s) positions are split over OpenMP threads; each computes its D/2 cos/sin values once
// into per-thread scratch and applies them to all N heads.
//
// Backward: the rotation by -angle, i.e. the forward with sin negated: dx[i] = dy[i]·cos +
// dy[i + D/2]·sin, dx[i + D/2] = dy[i + D/2]·cos + (-dy[i])·sin, which is bitwise what PyTorch's
// autograd computes for dy·cos + rotate_halfᵀ(dy·sin) (negating a factor is exact).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

#include "tensor/check.h"

namespace autosp::cpu {

namespace {

// Position p's factors: cs[i] = cos(angle)·attention, sn[i] = sign·(sin(angle)·attention).
template <class T>
void factors_of(T pos, const T* inv_freq, int64_t H, T attention, T sign, T* cs, T* sn) {
  for (int64_t i = 0; i < H; ++i) {
    const T angle = pos * inv_freq[i];
    cs[i] = std::cos(angle) * attention;
    sn[i] = sign * (std::sin(angle) * attention);
  }
}

// One row: y = x·cs + rotate_half(x)·sn.
template <class T>
void rotate_row(const T* xr, const T* cs, const T* sn, T* yr, int64_t H) {
  for (int64_t i = 0; i < H; ++i) {
    const T x_cos = xr[i] * cs[i], rot_sin = (-xr[i + H]) * sn[i];
    yr[i] = x_cos + rot_sin;
  }
  for (int64_t i = 0; i < H; ++i) {
    const T x_cos = xr[i + H] * cs[i], rot_sin = xr[i] * sn[i];
    yr[i + H] = x_cos + rot_sin;
  }
}

template <class T>
std::vector<T> inv_freq_of(int64_t D, double theta, const RopeScaling& scaling) {
  AUTOSP_ASSERT(D > 0 && D % 2 == 0, "rope head dim ", D, " must be even");
  std::vector<T> inv_freq(static_cast<size_t>(D / 2), T(0));
  rope_inv_freq(inv_freq.data(), D, theta, scaling);
  return inv_freq;
}

// y = x·cos(angle) + rotate_half(x)·(sign·sin(angle)); sign = 1 forward, -1 backward.
template <class T>
void rope_rotate(const T* x, const int64_t* position_ids, T* y, int64_t B, int64_t N, int64_t S, int64_t D,
                 double theta, const RopeScaling& scaling, T sign) {
  AUTOSP_ASSERT(x != y, "rope x and y may not alias");
  const int64_t H = D / 2;
  const std::vector<T> inv_freq = inv_freq_of<T>(D, theta, scaling);  // [D/2]
  const T attention = T(kernels::rope_attention_factor(scaling));  // yarn's; 1 (exact) otherwise
#pragma omp parallel if (B * N * S * D > (1 << 15))
  {
    std::vector<T> cs(static_cast<size_t>(H)), sn(static_cast<size_t>(H));  // [D/2] per thread
#pragma omp for schedule(static)
    for (int64_t bs = 0; bs < B * S; ++bs) {
      const int64_t b = bs / S, s = bs % S;
      factors_of(T(position_ids[bs]), inv_freq.data(), H, attention, sign, cs.data(), sn.data());  // position_ids [B, S]
      for (int64_t n = 0; n < N; ++n) {
        const int64_t off = ((b * N + n) * S + s) * D;  // x, y [B, N, S, D]
        rotate_row(x + off, cs.data(), sn.data(), y + off, H);
      }
    }
  }
}

}  // namespace

template <class T>
void rope_forward(const T* x, const int64_t* position_ids, T* y, int64_t B, int64_t N, int64_t S,
                  int64_t D, double theta, const RopeScaling& scaling) {
  rope_rotate(x, position_ids, y, B, N, S, D, theta, scaling, T(1));
}

template <class T>
void rope_backward(const T* dy, const int64_t* position_ids, T* dx, int64_t B, int64_t N, int64_t S, int64_t D,
                   double theta, const RopeScaling& scaling) {
  rope_rotate(dy, position_ids, dx, B, N, S, D, theta, scaling, T(-1));
}

template <class T>
void rope_factors(const int64_t* position_ids, int64_t positions, int64_t D, double theta, const RopeScaling& scaling,
                  bool backward, T* cos_f, T* sin_f) {
  const int64_t H = D / 2;
  const std::vector<T> inv_freq = inv_freq_of<T>(D, theta, scaling);
  const T attention = T(kernels::rope_attention_factor(scaling));
#pragma omp parallel for schedule(static) if (positions * H > (1 << 13))
  for (int64_t p = 0; p < positions; ++p)
    factors_of(T(position_ids[p]), inv_freq.data(), H, attention, T(backward ? -1 : 1), cos_f + p * H, sin_f + p * H);
}

template <class T>
void rope_apply(const T* x, const T* cos_f, const T* sin_f, T* y, int64_t rows, int64_t D) {
  AUTOSP_ASSERT(x != y, "rope x and y may not alias");
  const int64_t H = D / 2;
  for (int64_t r = 0; r < rows; ++r) rotate_row(x + r * D, cos_f + r * H, sin_f + r * H, y + r * D, H);
}

template void rope_factors<float>(const int64_t*, int64_t, int64_t, double, const RopeScaling&, bool, float*, float*);
template void rope_factors<double>(const int64_t*, int64_t, int64_t, double, const RopeScaling&, bool, double*,
                                   double*);
template void rope_apply<float>(const float*, const float*, const float*, float*, int64_t, int64_t);
template void rope_apply<double>(const double*, const double*, const double*, double*, int64_t, int64_t);
template void rope_forward<float>(const float*, const int64_t*, float*, int64_t, int64_t, int64_t,
                                  int64_t, double, const RopeScaling&);
template void rope_forward<double>(const double*, const int64_t*, double*, int64_t, int64_t,
                                   int64_t, int64_t, double, const RopeScaling&);
template void rope_backward<float>(const float*, const int64_t*, float*, int64_t, int64_t, int64_t, int64_t,
                                   double, const RopeScaling&);
template void rope_backward<double>(const double*, const int64_t*, double*, int64_t, int64_t, int64_t, int64_t,
                                    double, const RopeScaling&);

}  // namespace autosp::cpu
