// CPU cross-entropy kernels, and the tiled head + loss (runtime.tiled_loss). Knows nothing of graphs.
// logits [rows, V] contiguous, labels [rows] int64; a label equal to ignore_index contributes nothing.
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"  // Bf16Gemm
#include "kernels/kinds.h"        // kIgnoreIndex

namespace autosp::cpu {

using kernels::kIgnoreIndex;

// The untiled loss. T is float, double or uint16_t (bf16 bits: each row widened into a per-thread
// f32 buffer and computed as the f32 kernel computes it, so the same bits as the f32 kernel on the
// widened logits at the same thread count; dlogits rounded once per entry).
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

// ---- the tiled head + loss: logits = x · wᵀ are never whole ----
//
// x [R, C] (R = rows = tokens), w [V, C] (the LM head, or the tied embedding), labels [R]. Rows go
// in chunks of linear_ce_chunk_rows(R, V) (or `chunk_rows`, for tests); a chunk's logits [r, V]
// live in `scratch` only (linear_ce_scratch_elems(R, V) elements, or chunk_rows · V), so no [R, V]
// tensor exists: the memory of Liger's
// FusedLinearCrossEntropy and ALST's tiled loss. The GEMMs are gemm_batched (kernels/cpu/matmul.h);
// the row loops run across threads; nothing depends on the thread count.

// The chunk (kernels/kinds.h, shared with the CUDA launcher).
using kernels::kLinearCeChunkElems;
using kernels::kLinearCeChunkRows;
using kernels::linear_ce_chunk_rows;
using kernels::linear_ce_scratch_elems;

// With softcap c > 0 (Gemma's final_logit_softcapping) every logit z of a chunk becomes
// c · tanh(z · (1/c)) in place before the row work (the untiled graph's scale, tanh, scale), and the
// backward multiplies each dlogit by the cap's derivative 1 - tanh² (the capped logit over c,
// squared); the argmax is the capped row's, the same index, as the cap is increasing.
//
// Returns Σ over valid rows of logsumexp(x_r · wᵀ) - x_r · w[label_r] (each row's sum in double),
// and writes predictions[r] = argmax_j (x_r · wᵀ)_j (first maximum on ties) for every row, and with
// `row_loss` [rows] each row's term (0 on ignored rows: DPO sums them by sequence). A label
// outside [0, V) that is not ignore_index throws autosp::UsageError naming it, before any work.
template <class T>
double linear_cross_entropy_sum(const T* x, const T* w, const int64_t* labels, int64_t* predictions, T* scratch,
                                int64_t rows, int64_t C, int64_t V, int64_t ignore_index = kIgnoreIndex,
                                int64_t chunk_rows = 0, double* row_loss = nullptr, double softcap = 0);

// The gradients of `grad` · that sum: per chunk the logits are computed again, turned into
// dlogits = grad · (softmax - onehot(label)) (0 on ignored rows) in place, then
// dx_c [r, C] = dlogits · w and dw [V, C] += dlogitsᵀ · x_c (overwritten by the first chunk).
// dw may be null (a frozen head): then only dx is computed (also in the bf16 form below). With
// `row_grad` [rows], row r's term has the gradient row_grad[r] instead of `grad` (DPO's per-sequence
// gradients; a row of 0 gets dlogits 0 without its softmax).
template <class T>
void linear_cross_entropy_backward(const T* x, const T* w, const int64_t* labels, double grad, T* dx, T* dw,
                                   T* scratch, int64_t rows, int64_t C, int64_t V,
                                   int64_t ignore_index = kIgnoreIndex, int64_t chunk_rows = 0,
                                   const double* row_grad = nullptr, double softcap = 0);

// The same on bf16 x, w, dx, dw (raw uint16_t bits) with the GEMMs on the CPU's bf16 GEMM `path`
// (gemm_bf16_batched: f32 accumulation): the logits chunk and its row work in f32 (scratch as
// for float), dlogits rounded to bf16 once as the GEMMs' operand (as the CUDA kernels hold it), dw
// summed over the chunks in f32 and rounded once.
double linear_cross_entropy_sum_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* w, const int64_t* labels,
                                     int64_t* predictions, float* scratch, int64_t rows, int64_t C, int64_t V,
                                     int64_t ignore_index = kIgnoreIndex, int64_t chunk_rows = 0,
                                     double* row_loss = nullptr, double softcap = 0);
void linear_cross_entropy_backward_bf16(Bf16Gemm path, const uint16_t* x, const uint16_t* w, const int64_t* labels,
                                        double grad, uint16_t* dx, uint16_t* dw, float* scratch, int64_t rows,
                                        int64_t C, int64_t V, int64_t ignore_index = kIgnoreIndex,
                                        int64_t chunk_rows = 0, const double* row_grad = nullptr,
                                        double softcap = 0);

}  // namespace autosp::cpu
