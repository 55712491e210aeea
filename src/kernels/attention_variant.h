// The attention variants beyond plain (causal) softmax attention that the flash kernels take (CPU:
// kernels/cpu/attention.h, CUDA: kernels/cuda/attention.cuh): a sliding window, a logit softcap,
// sinks, and the offset of ring attention's chunk pairs. A neutral kernel header (like kinds.h):
// the launchers fill it from the attention node's attributes; no graph, no device, no state.
//
// Positions: query row i of a call stands at i + shift in key coordinates, shift = Skv - Sq + offset
// (bottom-right aligned; offset = 0 for sdpa, the query chunk's start minus the key chunk's for a
// ring chunk pair). Causal: key j is visible when j ≤ i + shift.
// Window w > 0 (Hugging Face's sliding_window, as transformers 4.44's eager masks draw it): key j is
// visible only when j > i + shift - w, so a query sees itself and the w - 1 keys before it.
// Softcap c > 0 (Gemma 2's attn_logit_softcapping): the logit scale · q·k becomes c · tanh(scale · q·k / c).
// Sinks [N] (one learned logit per query head, gpt-oss): exp(sinks[h]) joins every softmax
// denominator of head h and attends to nothing; the saved log-sum-exp includes it. The backward
// writes dsinks [N] (overwritten), dL/dsink_h = -Σ_{b,i} exp(sink_h - lse_i) · Σ_d dout_i · o_i.
#pragma once

#include <cstdint>

namespace autosp {

template <class T>
struct AttentionVariant {
  int64_t window = 0;         // 0: no window
  double softcap = 0;         // 0: no softcap
  int64_t offset = 0;         // added to the causal shift Skv - Sq
  const T* sinks = nullptr;   // [N] or null
  T* dsinks = nullptr;        // [N] backward output, or null (then dL/dsinks is not computed)

  bool plain() const { return window == 0 && softcap == 0 && offset == 0 && sinks == nullptr; }
};

}  // namespace autosp
