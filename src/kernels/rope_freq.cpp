// rope_inv_freq (kernels/kinds.h): the inverse frequencies of the rotary embedding, host code both
// kernel backends use (the CPU kernel computes them per call; the CUDA launcher uploads them).
// For float every step is float and in Hugging Face's order (powf, then a float divide; then
// rope_scaling), so the values match its float32 buffer bit for bit; the pragma below stops GCC
// from fusing a product and a sum into an FMA when the target has one. Knows nothing of graphs.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
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
  }
}

template void rope_inv_freq<float>(float*, int64_t, double, const RopeScaling&);
template void rope_inv_freq<double>(double*, int64_t, double, const RopeScaling&);

}  // namespace autosp::kernels
