// CPU cross-entropy: Σ over labelled rows of logsumexp(logits[r]) - logits[r, label[r]], and the
// count of labelled rows. Knows nothing of graphs.
//
// Labels are validated up front (a bad label is the user's data: UsageError naming the label and
// the row); rows are then split over OpenMP threads. Each row uses a stable logsumexp (max first);
// exp runs in T, the row sum and the total are accumulated in double.
//
// Backward: rows split over threads; each row's softmax is recomputed with the same stable
// max-shifted exp, then scaled by grad / sum in double; ignored rows are zero-filled.
//
// The tiled head + loss (linear_cross_entropy_*) runs the same row arithmetic on one chunk of
// logits at a time, which a GEMM has just written into the scratch; in f32 the row passes (max and
// argmax, the sum of exp, the softmax) are 16-lane vectors with vec16's exp16 (~1 ulp).
#include "kernels/cpu/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vec16.h"
#include "tensor/check.h"
#include "tensor/convert.h"

namespace autosp::cpu {
namespace {

void check_labels(const int64_t* labels, int64_t rows, int64_t V, int64_t ignore_index) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t y = labels[r];
    if (y != ignore_index && (y < 0 || y >= V))
      throw UsageError(str("[cross_entropy] label ", y, " at row ", r, " is outside [0, ", V,
                           ") and is not ignore_index ", ignore_index));
  }
}

// ---- one row of logits x[0, V) ----
using vec16::f32x16;
using vec16::load;
using vec16::load_part;
using vec16::splat;
using vec16::store;
using vec16::store_part;

// The maximum; a NaN anywhere makes it NaN, so the row's loss is NaN, as the untiled
// cross_entropy_sum's is.
AUTOSP_VEC16_CLONES float row_max(const float* x, int64_t V) {
  const float inf = std::numeric_limits<float>::infinity();
  f32x16 hi = splat(-inf), bad = splat(0.0f);
  int64_t j = 0;
  for (; j + 16 <= V; j += 16) {
    const f32x16 v = load(x + j);
    hi = hi < v ? v : hi;
    bad += v - v;  // 0, or NaN where v is NaN or ±inf
  }
  if (j < V) {
    const f32x16 v = load_part(x + j, V - j, -inf);
    hi = hi < v ? v : hi;
    bad += vec16::load_part(x + j, V - j, 0.0f) * 0.0f;
  }
  float m = hi[0], nan = 0;
  for (int l = 0; l < 16; ++l) m = std::max(m, hi[l]), nan += bad[l];
  if (nan != nan && std::any_of(x, x + V, [](float v) { return v != v; }))  // a NaN, not only ±inf
    return std::numeric_limits<float>::quiet_NaN();
  return m;
}
double row_max(const double* x, int64_t V) {
  if (std::any_of(x, x + V, [](double v) { return v != v; })) return std::numeric_limits<double>::quiet_NaN();
  return *std::max_element(x, x + V);
}

// Where the maximum m first occurs (0 when nothing equals it: a NaN maximum).
template <class T>
int64_t first_index_of(const T* x, int64_t V, T m) {
  const int64_t at = std::find(x, x + V, m) - x;
  return at < V ? at : 0;
}

// Σ_j exp(x[j] - m), summed per 16 lanes in f32 over blocks of 1024 and across blocks in double.
AUTOSP_VEC16_CLONES double row_sum_exp(const float* x, int64_t V, float m) {
  double total = 0;
  for (int64_t b = 0; b < V; b += 1024) {
    const int64_t end = std::min(V, b + 1024);
    f32x16 sum = splat(0.0f);
    int64_t j = b;
    for (; j + 16 <= end; j += 16) sum += vec16::exp16(load(x + j) - m);
    if (j < end) {
      const f32x16 p = vec16::exp16(load_part(x + j, end - j, 0.0f) - m);
      for (int64_t l = 0; l < end - j; ++l) sum[l] += p[l];
    }
    double s = 0;
    for (int l = 0; l < 16; ++l) s += double(sum[l]);
    total += s;
  }
  return total;
}
double row_sum_exp(const double* x, int64_t V, double m) {
  double s = 0;
  for (int64_t j = 0; j < V; ++j) s += std::exp(x[j] - m);
  return s;
}

// x[j] = g · exp(x[j] - m) for j < V (the softmax times g, with g = grad / Σ exp).
AUTOSP_VEC16_CLONES void row_scaled_exp(float* x, int64_t V, float m, float g) {
  int64_t j = 0;
  for (; j + 16 <= V; j += 16) store(x + j, vec16::exp16(load(x + j) - m) * g);
  if (j < V) store_part(x + j, vec16::exp16(load_part(x + j, V - j, 0.0f) - m) * g, V - j);
}
void row_scaled_exp(double* x, int64_t V, double m, double g) {
  for (int64_t j = 0; j < V; ++j) x[j] = g * std::exp(x[j] - m);
}

// Gemma's final softcap on a row of logits, in place: x[j] = c · tanh(x[j] · (1/c)) (the untiled
// graph's scale, tanh, scale, each in T).
template <class T>
void cap_row(T* x, int64_t V, double softcap) {
  const T inv = T(1.0 / softcap), c = T(softcap);
  for (int64_t j = 0; j < V; ++j) x[j] = std::tanh(x[j] * inv) * c;
}

// The dlogits of a capped row x (the capped logits, max m), in place, through the cap:
// x[j] = (g · exp(x[j] - m) - [j = y] · gr) · (1 - (x[j] / c)²), tanh's derivative from the capped value.
template <class T>
void row_capped_grad(T* x, int64_t V, T m, double g, int64_t y, double gr, double softcap) {
  const T inv = T(1.0 / softcap);
  for (int64_t j = 0; j < V; ++j) {
    const T t = x[j] * inv;
    const double d = g * double(std::exp(x[j] - m)) - (j == y ? gr : 0.0);
    x[j] = T(d * double(T(1) - t * t));
  }
}

}  // namespace

namespace {

// The type a row is computed in (bf16 rows, uint16_t bits, are widened to f32 per row), and row r
// of logits in it: in place, or widened into the thread's buffer.
template <class T>
using row_t = std::conditional_t<std::is_same_v<T, uint16_t>, float, T>;
template <class T>
const row_t<T>* row_of(const T* x, int64_t V, std::vector<row_t<T>>& buf) {
  if constexpr (!std::is_same_v<T, uint16_t>) return x;
  else {
    for (int64_t j = 0; j < V; ++j) buf[size_t(j)] = bf16_to_f32(x[j]);
    return buf.data();
  }
}

// logsumexp(x) - x[label] over one row [V].
template <class C>
double row_loss(const C* xr, int64_t label, int64_t V) {
  C m = xr[0];
  for (int64_t j = 1; j < V; ++j) m = std::max(m, xr[j]);
  double s[4] = {0, 0, 0, 0};  // partial sums of exp(x - max)
  int64_t j = 0;
  for (; j + 4 <= V; j += 4)
    for (int k = 0; k < 4; ++k) s[k] += double(std::exp(xr[j + k] - m));
  for (; j < V; ++j) s[0] += double(std::exp(xr[j] - m));
  const double lse = double(m) + std::log((s[0] + s[1]) + (s[2] + s[3]));
  return lse - double(xr[label]);
}

// dr = grad · (softmax(xr) - onehot(label)) over one row [V]; dr may alias xr.
template <class C>
void row_loss_backward(const C* xr, C* dr, int64_t label, int64_t V, double grad) {
  C m = xr[0];
  for (int64_t j = 1; j < V; ++j) m = std::max(m, xr[j]);
  for (int64_t j = 0; j < V; ++j) dr[j] = std::exp(xr[j] - m);
  double s[4] = {0, 0, 0, 0};  // partial sums of exp(x - max)
  int64_t j = 0;
  for (; j + 4 <= V; j += 4)
    for (int k = 0; k < 4; ++k) s[k] += double(dr[j + k]);
  for (; j < V; ++j) s[0] += double(dr[j]);
  const double g = grad / ((s[0] + s[1]) + (s[2] + s[3]));
  const double p_label = double(dr[label]) * g;  // grad · softmax at the label, before the onehot
  for (j = 0; j < V; ++j) dr[j] = C(double(dr[j]) * g);
  dr[label] = C(p_label - grad);
}

}  // namespace

template <class T>
double cross_entropy_sum(const T* logits, const int64_t* labels, int64_t rows, int64_t V,
                         int64_t ignore_index) {
  AUTOSP_ASSERT(rows >= 0 && V > 0, "cross_entropy rows ", rows, " V ", V);
  check_labels(labels, rows, V, ignore_index);
  double total = 0;
#pragma omp parallel reduction(+ : total) if (rows * V > (1 << 14))
  {
    std::vector<row_t<T>> buf(std::is_same_v<T, uint16_t> ? size_t(V) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      if (labels[r] != ignore_index) total += row_loss(row_of(logits + r * V, V, buf), labels[r], V);
  }
  return total;
}

template <class T>
void cross_entropy_backward(const T* logits, const int64_t* labels, T* dlogits, int64_t rows, int64_t V, double grad,
                            int64_t ignore_index) {
  AUTOSP_ASSERT(rows >= 0 && V > 0, "cross_entropy_backward rows ", rows, " V ", V);
  for (int64_t r = 0; r < rows; ++r)
    AUTOSP_ASSERT(labels[r] == ignore_index || (labels[r] >= 0 && labels[r] < V), "cross_entropy_backward label ",
                  labels[r], " at row ", r);
#pragma omp parallel if (rows * V > (1 << 14))
  {
    std::vector<row_t<T>> buf(std::is_same_v<T, uint16_t> ? size_t(V) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      T* dr = dlogits + r * V;  // [V]; may alias logits
      if (labels[r] == ignore_index) {
        std::fill(dr, dr + V, T(0));
        continue;
      }
      if constexpr (std::is_same_v<T, uint16_t>) {  // the f32 row in the buffer, rounded once
        row_loss_backward(row_of(logits + r * V, V, buf), buf.data(), labels[r], V, grad);
        for (int64_t j = 0; j < V; ++j) dr[j] = f32_to_bf16(buf[size_t(j)]);
      } else {
        row_loss_backward(logits + r * V, dr, labels[r], V, grad);
      }
    }
  }
}

int64_t count_valid(const int64_t* labels, int64_t n, int64_t ignore_index) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += labels[i] != ignore_index;
  return count;
}

namespace {

// The tiled head + loss over the chunk GEMMs of an element type: `logits(x_c, r, scratch)` writes a
// chunk's logits [r, V] = x_c · wᵀ into scratch; `back(x_c, r, r0, scratch, dx_c, first)` runs the
// backward's two GEMMs from the chunk's dlogits in scratch (dx_c, and dw overwritten when `first`,
// else accumulated). T is the type of the logits chunk, X the stored x.
template <class T, class X, class Logits>
double linear_ce_sum(const X* x, const int64_t* labels, int64_t* predictions, T* scratch, int64_t rows, int64_t C,
                     int64_t V, int64_t ignore_index, int64_t chunk_rows, double* row_loss, double softcap,
                     const Logits& logits) {
  AUTOSP_ASSERT(C > 0 && chunk_rows >= 0, "linear_cross_entropy C ", C, " chunk ", chunk_rows);
  const int64_t chunk = chunk_rows > 0 ? chunk_rows : linear_ce_chunk_rows(rows, V);
  check_labels(labels, rows, V, ignore_index);
  double total = 0;
  std::vector<double> terms(size_t(std::min(rows, chunk)));  // each row's term, summed in order
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r = std::min(chunk, rows - r0);
    logits(x + r0 * C, r, scratch);  // [r, V]
#pragma omp parallel for schedule(static) if (r * V > (1 << 14))
    for (int64_t i = 0; i < r; ++i) {
      T* row = scratch + i * V;
      if (softcap > 0) cap_row(row, V, softcap);
      const T m = row_max(row, V);
      predictions[r0 + i] = first_index_of(row, V, m);
      const int64_t y = labels[r0 + i];
      terms[size_t(i)] = y == ignore_index ? 0.0 : double(m) + std::log(row_sum_exp(row, V, m)) - double(row[y]);
    }
    for (int64_t i = 0; i < r; ++i) total += terms[size_t(i)];  // in row order: the same at any thread count
    if (row_loss) std::copy(terms.begin(), terms.begin() + r, row_loss + r0);
  }
  return total;
}

template <class T, class X, class Logits, class Back>
void linear_ce_backward(const X* x, const int64_t* labels, double grad, const double* row_grad, T* scratch, int64_t rows,
                        int64_t C, int64_t V, int64_t ignore_index, int64_t chunk_rows, double softcap,
                        const Logits& logits, const Back& back) {
  AUTOSP_ASSERT(C > 0 && chunk_rows >= 0, "linear_cross_entropy_backward C ", C, " chunk ", chunk_rows);
  const int64_t chunk = chunk_rows > 0 ? chunk_rows : linear_ce_chunk_rows(rows, V);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r = std::min(chunk, rows - r0);
    const X* x_c = x + r0 * C;
    logits(x_c, r, scratch);
#pragma omp parallel for schedule(static) if (r * V > (1 << 14))
    for (int64_t i = 0; i < r; ++i) {
      T* row = scratch + i * V;  // logits, then dlogits
      const int64_t y = labels[r0 + i];
      const double gr = row_grad ? row_grad[r0 + i] : grad;  // this row's loss gradient
      if (y == ignore_index || gr == 0) {
        std::fill(row, row + V, T(0));
        continue;
      }
      AUTOSP_ASSERT(y >= 0 && y < V, "linear_cross_entropy_backward label ", y, " at row ", r0 + i);
      if (softcap > 0) cap_row(row, V, softcap);
      const T m = row_max(row, V);
      const double g = gr / row_sum_exp(row, V, m);
      if (softcap > 0) {
        row_capped_grad(row, V, m, g, y, gr, softcap);
        continue;
      }
      row_scaled_exp(row, V, m, T(g));
      row[y] -= T(gr);
    }
    back(x_c, r, r0, scratch, r0 == 0);
  }
}

}  // namespace

template <class T>
double linear_cross_entropy_sum(const T* x, const T* w, const int64_t* labels, int64_t* predictions, T* scratch,
                                int64_t rows, int64_t C, int64_t V, int64_t ignore_index, int64_t chunk_rows,
                                double* row_loss, double softcap) {
  return linear_ce_sum(x, labels, predictions, scratch, rows, C, V, ignore_index, chunk_rows, row_loss, softcap,
                       [&](const T* x_c, int64_t r, T* logits) {
                         gemm_batched<T>(false, true, 1, r, V, C, T(1), x_c, 0, w, 0, T(0), logits, 0);
                       });
}

template <class T>
void linear_cross_entropy_backward(const T* x, const T* w, const int64_t* labels, double grad, T* dx, T* dw,
                                   T* scratch, int64_t rows, int64_t C, int64_t V, int64_t ignore_index,
                                   int64_t chunk_rows, const double* row_grad, double softcap) {
  if (rows == 0 && dw) std::fill(dw, dw + V * C, T(0));  // no rows: no gradient
  const auto logits = [&](const T* x_c, int64_t r, T* out) {
    gemm_batched<T>(false, true, 1, r, V, C, T(1), x_c, 0, w, 0, T(0), out, 0);
  };
  // dx_c [r, C] = dlogits [r, V] · w [V, C]; dw [V, C] (+)= dlogitsᵀ [V, r] · x_c [r, C]
  const auto back = [&](const T* x_c, int64_t r, int64_t r0, const T* dlogits, bool first) {
    gemm_batched<T>(false, false, 1, r, C, V, T(1), dlogits, 0, w, 0, T(0), dx + r0 * C, 0);
    if (dw) gemm_batched<T>(true, false, 1, V, C, r, T(1), dlogits, 0, x_c, 0, first ? T(0) : T(1), dw, 0);
  };
  linear_ce_backward(x, labels, grad, row_grad, scratch, rows, C, V, ignore_index, chunk_rows, softcap, logits, back);
}

double linear_cross_entropy_sum_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* w, const int64_t* labels,
                                     int64_t* predictions, float* scratch, int64_t rows, int64_t C, int64_t V,
                                     int64_t ignore_index, int64_t chunk_rows, double* row_loss, double softcap) {
  return linear_ce_sum(x, labels, predictions, scratch, rows, C, V, ignore_index, chunk_rows, row_loss, softcap,
                       [&](const uint16_t* x_c, int64_t r, float* logits) {
                         gemm_bf16_batched(path, false, true, 1, r, V, C, 1.0f, x_c, 0, w, 0, 0.0f, logits, 0);
                       });
}

void linear_cross_entropy_backward_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* w, const int64_t* labels,
                                        double grad, uint16_t* dx, uint16_t* dw, float* scratch, int64_t rows,
                                        int64_t C, int64_t V, int64_t ignore_index, int64_t chunk_rows,
                                        const double* row_grad, double softcap) {
  const int64_t chunk = chunk_rows > 0 ? chunk_rows : linear_ce_chunk_rows(rows, V);
  std::vector<uint16_t> dlogits16(size_t(std::min(rows, chunk) * V));
  std::vector<float> dx_c(size_t(std::min(rows, chunk) * C)), dw32(dw ? size_t(V * C) : 0);  // dw summed in f32 (0: no rows)
  const auto logits = [&](const uint16_t* x_c, int64_t r, float* out) {
    gemm_bf16_batched(path, false, true, 1, r, V, C, 1.0f, x_c, 0, w, 0, 0.0f, out, 0);
  };
  const auto back = [&](const uint16_t* x_c, int64_t r, int64_t r0, const float* dlogits, bool first) {
    cast<float, uint16_t>(dlogits, dlogits16.data(), r * V);  // what the GEMMs read
    gemm_bf16_batched(path, false, false, 1, r, C, V, 1.0f, dlogits16.data(), 0, w, 0, 0.0f, dx_c.data(), 0);
    cast<float, uint16_t>(dx_c.data(), dx + r0 * C, r * C);
    if (dw)
      gemm_bf16_batched(path, true, false, 1, V, C, r, 1.0f, dlogits16.data(), 0, x_c, 0, first ? 0.0f : 1.0f,
                        dw32.data(), 0);
  };
  linear_ce_backward(x, labels, grad, row_grad, scratch, rows, C, V, ignore_index, chunk_rows, softcap, logits, back);
  if (dw) cast<float, uint16_t>(dw32.data(), dw, V * C);
}

template double cross_entropy_sum<float>(const float*, const int64_t*, int64_t, int64_t, int64_t);
template double cross_entropy_sum<double>(const double*, const int64_t*, int64_t, int64_t, int64_t);
template void cross_entropy_backward<float>(const float*, const int64_t*, float*, int64_t, int64_t, double,
                                            int64_t);
template void cross_entropy_backward<double>(const double*, const int64_t*, double*, int64_t, int64_t, double,
                                             int64_t);
template double cross_entropy_sum<uint16_t>(const uint16_t*, const int64_t*, int64_t, int64_t, int64_t);
template void cross_entropy_backward<uint16_t>(const uint16_t*, const int64_t*, uint16_t*, int64_t, int64_t, double,
                                               int64_t);
#define AUTOSP_INSTANTIATE_LINEAR_CE(T)                                                                            \
  template double linear_cross_entropy_sum<T>(const T*, const T*, const int64_t*, int64_t*, T*, int64_t, int64_t,  \
                                              int64_t, int64_t, int64_t, double*, double);                       \
  template void linear_cross_entropy_backward<T>(const T*, const T*, const int64_t*, double, T*, T*, T*, int64_t, \
                                                 int64_t, int64_t, int64_t, int64_t, const double*, double);
AUTOSP_INSTANTIATE_LINEAR_CE(float)
AUTOSP_INSTANTIATE_LINEAR_CE(double)
#undef AUTOSP_INSTANTIATE_LINEAR_CE

}  // namespace autosp::cpu
