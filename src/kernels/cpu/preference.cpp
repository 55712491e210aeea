// CPU kernels of preference training. The per-target log-probability is one row of the
// cross-entropy kernels (kernels/cpu/loss.h) negated, so both losses score a token alike; rows run
// across threads, and the sums into sequences run in order, so nothing depends on the thread count.
#include "kernels/cpu/preference.h"

#include <cmath>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/loss.h"
#include "tensor/check.h"

namespace autosp::cpu {
namespace {

// The index into a [B, 2, K] table of row b's slot s (≠ 0), or a UsageError naming it.
int64_t slot_index(int64_t s, int64_t b, int64_t t, int64_t K) {
  if (s < -K || s > K)
    throw UsageError(str("[sequence_logps] pair slot ", s, " at row ", b, ", position ", t, " is outside [-", K, ", ",
                         K, "]"));
  return (b * 2 + (s > 0 ? 0 : 1)) * K + std::llabs(s) - 1;
}

bool scored(const int64_t* labels, const int64_t* slots, int64_t r, int64_t ignore_index) {
  return labels[r] != ignore_index && slots[r] != 0;
}

// Each target's index into the [B, 2, K] table, −1 where it is not summed.
std::vector<int64_t> table_index(const int64_t* labels, const int64_t* slots, int64_t B, int64_t S, int64_t K,
                                 int64_t ignore_index) {
  std::vector<int64_t> at(static_cast<size_t>(B * S), -1);
  for (int64_t r = 0; r < B * S; ++r)
    if (scored(labels, slots, r, ignore_index)) at[size_t(r)] = slot_index(slots[r], r / S, r % S, K);
  return at;
}

}  // namespace

template <class T>
void slot_sums(const double* row_loss, const int64_t* labels, const int64_t* slots, T* out, int64_t B, int64_t S,
               int64_t K, int64_t ignore_index) {
  const std::vector<int64_t> at = table_index(labels, slots, B, S, K, ignore_index);
  std::vector<double> sum(static_cast<size_t>(B * 2 * K), 0.0);
  for (size_t r = 0; r < at.size(); ++r)
    if (at[r] >= 0) sum[size_t(at[r])] -= row_loss[r];
  for (size_t i = 0; i < sum.size(); ++i) out[i] = static_cast<T>(sum[i]);
}

template <class T>
void slot_row_grads(const int64_t* labels, const int64_t* slots, const T* grad, double* row_grad, int64_t B, int64_t S,
                    int64_t K, int64_t ignore_index) {
  const std::vector<int64_t> at = table_index(labels, slots, B, S, K, ignore_index);
  for (size_t r = 0; r < at.size(); ++r) row_grad[r] = at[r] >= 0 ? -double(grad[at[r]]) : 0.0;
}

namespace {

// L: the logits' storage (float, double, uint16_t = bf16 bits: the row kernels widen each row),
// O: the sums' and the gradient's type.
template <class L, class O>
void logps(const L* logits, const int64_t* labels, const int64_t* slots, O* out, int64_t B, int64_t S, int64_t V,
           int64_t K, int64_t ignore_index) {
  const int64_t rows = B * S;
  const std::vector<int64_t> at = table_index(labels, slots, B, S, K, ignore_index);
  std::vector<double> ce(static_cast<size_t>(rows), 0.0);  // each summed target's cross entropy
#pragma omp parallel for schedule(static) if (rows * V > (1 << 14))
  for (int64_t r = 0; r < rows; ++r)
    if (at[size_t(r)] >= 0) ce[size_t(r)] = cross_entropy_sum<L>(logits + r * V, labels + r, 1, V, ignore_index);
  slot_sums(ce.data(), labels, slots, out, B, S, K, ignore_index);
}

template <class L, class O>
void logps_backward(const L* logits, const int64_t* labels, const int64_t* slots, const O* grad, L* dlogits,
                    int64_t B, int64_t S, int64_t V, int64_t K, int64_t ignore_index) {
  const int64_t rows = B * S;
#pragma omp parallel for schedule(static) if (rows * V > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    if (!scored(labels, slots, r, ignore_index)) {
      std::fill(dlogits + r * V, dlogits + (r + 1) * V, L(0));
      continue;
    }
    const double g = double(grad[slot_index(slots[r], r / S, r % S, K)]);
    cross_entropy_backward<L>(logits + r * V, labels + r, dlogits + r * V, 1, V, -g, ignore_index);
  }
}

}  // namespace

template <class T>
void sequence_logps(const T* logits, const int64_t* labels, const int64_t* slots, T* out, int64_t B, int64_t S,
                    int64_t V, int64_t K, int64_t ignore_index) {
  logps(logits, labels, slots, out, B, S, V, K, ignore_index);
}

template <class T>
void sequence_logps_backward(const T* logits, const int64_t* labels, const int64_t* slots, const T* grad, T* dlogits,
                             int64_t B, int64_t S, int64_t V, int64_t K, int64_t ignore_index) {
  logps_backward(logits, labels, slots, grad, dlogits, B, S, V, K, ignore_index);
}

void sequence_logps_bf16(const uint16_t* logits, const int64_t* labels, const int64_t* slots, float* out, int64_t B,
                         int64_t S, int64_t V, int64_t K, int64_t ignore_index) {
  logps(logits, labels, slots, out, B, S, V, K, ignore_index);
}

void sequence_logps_backward_bf16(const uint16_t* logits, const int64_t* labels, const int64_t* slots,
                                  const float* grad, uint16_t* dlogits, int64_t B, int64_t S, int64_t V, int64_t K,
                                  int64_t ignore_index) {
  logps_backward(logits, labels, slots, grad, dlogits, B, S, V, K, ignore_index);
}

template <class T>
double dpo_loss(const T* policy, const T* reference, const T* tokens, const T* norms, int64_t B, int64_t K,
                const DpoArgs& a, T* dpolicy, double grad) {
  return kernels::dpo_table(policy, reference, tokens, norms, B, K, a, dpolicy, grad);
}

#define AUTOSP_PREFERENCE(T)                                                                                    \
  template void sequence_logps<T>(const T*, const int64_t*, const int64_t*, T*, int64_t, int64_t, int64_t,    \
                                  int64_t, int64_t);                                                           \
  template void sequence_logps_backward<T>(const T*, const int64_t*, const int64_t*, const T*, T*, int64_t,   \
                                           int64_t, int64_t, int64_t, int64_t);                                \
  template double dpo_loss<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, const DpoArgs&, T*,    \
                              double);                                                                         \
  template void slot_sums<T>(const double*, const int64_t*, const int64_t*, T*, int64_t, int64_t, int64_t,       \
                             int64_t);                                                                         \
  template void slot_row_grads<T>(const int64_t*, const int64_t*, const T*, double*, int64_t, int64_t, int64_t,  \
                                  int64_t);
AUTOSP_PREFERENCE(float)
AUTOSP_PREFERENCE(double)
#undef AUTOSP_PREFERENCE

}  // namespace autosp::cpu
