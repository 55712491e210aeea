// CPU cross-entropy launchers. Knows nothing of graphs.
// logits [rows, V] contiguous, labels [rows] int64; a label equal to ignore_index contributes nothing.
#pragma once

#include <cstdint>

namespace autosp::cpu {

inline constexpr int64_t kIgnoreIndex = -100;

// Returns Σ over valid rows of (logsumexp(logits[r]) - logits[r, label[r]]), accumulated in double.
// A label outside [0, V) that is not ignore_index throws autosp::UsageError naming it.
template <class T>
double cross_entropy_sum(const T* logits, const int64_t* labels, int64_t rows, int64_t V,
                         int64_t ignore_index = kIgnoreIndex);

// Number of labels that are not ignore_index.
int64_t count_valid(const int64_t* labels, int64_t n, int64_t ignore_index = kIgnoreIndex);

// dlogits[r, :] = grad · (softmax(logits[r, :]) - onehot(label[r])) for valid rows, 0 for ignored
// rows. `grad` is the gradient of the summed loss. Labels were validated by the forward.
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* labels, T* dlogits, int64_t rows, int64_t V, double grad,
                            int64_t ignore_index = kIgnoreIndex);

}  // namespace autosp::cpu
