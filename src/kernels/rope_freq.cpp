// rope_inv_freq (kernels/kinds.h): the inverse frequencies of the rotary embedding, host code both
// kernel backends use (the CPU kernel computes them per call; the CUDA launcher uploads them).
// For float every step is float and in Hugging Face's order (powf, then a float divide; then
// rope_scaling), so the values match its float32 buffer bit for bit; the pragma below stops GCC
// from fusing a product and a sum into an FMA when the target has one. Knows nothing of graphs.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <algorithm>
#include <cmath>

#include "kernels/kinds.h"

namespace autosp::kernels {

template <class A>
void rope_inv_freq(A* inv_freq, int64_t D, double theta, const RopeScaling& sc) {
  const int64_t H = D / 2;
  const A theta_a = A(theta);
  for (int64_t i = 0; i < H; ++i) inv_freq[i] = A(1) / std::pow(theta_a, A(2 * i) / A(D));
  switch (sc.kind) {
    case RopeScaling::none: return;
    case RopeScaling::linear:
      for (int64_t i = 0; i < H; ++i) inv_freq[i] = inv_freq[i] / A(sc.factor);
      return;
    case RopeScaling::llama3: {
      // Scalars are Python floats in HF, so each is formed in double and rounded once to A.
      const A factor = A(sc.factor), low = A(sc.low_freq_factor), old_len = A(sc.original_max_position_embeddings);
      const A band = A(sc.high_freq_factor - sc.low_freq_factor);
      const A low_wavelen = A(sc.original_max_position_embeddings / sc.low_freq_factor);
      const A high_wavelen = A(sc.original_max_position_embeddings / sc.high_freq_factor);
      const A two_pi = A(2 * 3.14159265358979323846);
      for (int64_t i = 0; i < H; ++i) {
        const A f = inv_freq[i], wavelen = two_pi / f;
        const A scaled = wavelen > low_wavelen ? f / factor : f;
        if (wavelen < high_wavelen || wavelen > low_wavelen) {
          inv_freq[i] = scaled;
        } else {
          const A smooth = (old_len / wavelen - low) / band;
          const A a = (A(1) - smooth) * scaled / factor, b = smooth * scaled;
          inv_freq[i] = a + b;
        }
      }
      return;
    }
    case RopeScaling::yarn: {
      // The correction range in Python floats (double), the ramp and the blend in A as HF's float32
      // tensors: pos_freqs = theta^(2i/D), extrapolation 1 / pos_freqs, interpolation
      // 1 / (factor · pos_freqs), inv_freq = interpolation · (1 − e) + extrapolation · e with the
      // extrapolation factor e = 1 − ramp.
      const double pi = 3.14159265358979323846, orig = sc.original_max_position_embeddings;
      const double fast = sc.beta_fast > 0 ? sc.beta_fast : 32, slow = sc.beta_slow > 0 ? sc.beta_slow : 1;
      auto correction_dim = [&](double rotations) {
        return (double(D) * std::log(orig / (rotations * 2 * pi))) / (2 * std::log(theta));
      };
      double low = correction_dim(fast), high = correction_dim(slow);
      if (sc.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, double(D - 1));
      if (low == high) high += 0.001;  // HF: "prevent singularity"
      const A lo = A(low), span = A(high - low), factor = A(sc.factor);
      for (int64_t i = 0; i < H; ++i) {
        const A pos_freq = std::pow(theta_a, A(2 * i) / A(D));
        const A extrapolation = A(1) / pos_freq, interpolation = A(1) / (factor * pos_freq);
        const A ramp = std::min(std::max((A(i) - lo) / span, A(0)), A(1));
        const A e = A(1) - ramp;
        const A a = interpolation * (A(1) - e), b = extrapolation * e;
        inv_freq[i] = a + b;
      }
      return;
    }
  }
}

double rope_attention_factor(const RopeScaling& sc) {
  if (sc.kind != RopeScaling::yarn) return 1.0;
  if (sc.attention_factor > 0) return sc.attention_factor;
  auto mscale = [&](double m) { return sc.factor <= 1 ? 1.0 : 0.1 * m * std::log(sc.factor) + 1.0; };
  if (sc.mscale != 0 && sc.mscale_all_dim != 0) return mscale(sc.mscale) / mscale(sc.mscale_all_dim);
  return mscale(1.0);
}

template void rope_inv_freq<float>(float*, int64_t, double, const RopeScaling&);
template void rope_inv_freq<double>(double*, int64_t, double, const RopeScaling&);

}  // namespace autosp::kernels
