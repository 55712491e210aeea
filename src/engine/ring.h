// Ring attention's schedule (the ring_attention and ring_attention_backward ops, made by
// graph/passes/autosp/insert_ring_attention): which blocks a ring rank holds and the loop that
// passes key/value blocks around the ring, shared by the CPU and CUDA launchers, which bring the
// attention of one block and the tensors. Knows nothing of kernels or devices.
//
// Zigzag layout: with R ring ranks the sequence is cut into 2R chunks of S/(2R) and ring rank r
// holds chunks r and 2R-1-r, side by side (its local sequence). Under causal masking every rank
// then does the same attention work: at its own step two diagonal blocks and one full block, at
// every other step two full blocks.
//
// Forward (R steps): at step s a rank computes with the K/V block of ring rank (r - s) mod R while
// that block goes on to rank r + 1 and the next arrives from rank r - 1 (send_recv_async, one
// message per step: R - 1 in all). Backward (R steps): the K/V blocks travel the same way; each
// step's partial dK, dV (the gradient of the block it holds) is added to the partial that arrived
// from rank r - 1 and sent on to rank r + 1, so after R steps and R messages every rank holds the
// whole dK, dV of its own block. The gradient message of step s overlaps with step s + 1.
#pragma once

#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "engine/dispatch.h"  // KernelCall

namespace autosp {

// The two global chunk indices (of 2R) ring rank r holds, in local order.
struct RankChunks {
  int64_t first, second;
};
inline RankChunks zigzag_chunks(int64_t r, int64_t R) { return {r, 2 * R - 1 - r}; }

// Which chunks a ring rank holds: zigzag (what the passes slice; the default), or contiguous, ring
// rank r holding chunks 2r and 2r+1 (the r-th S/R of the sequence in order). Nothing slices
// the sequence contiguously for a ring: a ring_attention node with the attribute layout =
// "contiguous" exists only in `autosp-bench --mode ring`, to time the causal imbalance zigzag removes.
enum class RingLayout { zigzag, contiguous };
inline RankChunks ring_rank_chunks(int64_t r, int64_t R, RingLayout layout) {
  return layout == RingLayout::zigzag ? zigzag_chunks(r, R) : RankChunks{2 * r, 2 * r + 1};
}

// The launchers keep every operand in halves: x [B, H, L(, D)] (L = 2c, this rank's two chunks side
// by side) as [2, B, H, c, D], so each chunk is a contiguous sdpa operand. These are the views
// between the two layouts (no data moves): x seen as halves, and contiguous halves seen as x.
Tensor halves_view(const Tensor& x);
Tensor interleaved_view(const Tensor& halves);

// One ring step's chunk pairs: B, query heads N, kv heads Nkv, chunk length c, head dim D, where
// this rank's query chunks (q) and the held block's key chunks (k) sit in the sequence, and the
// document starts [B, 2c] (global positions, on the host; null without documents).
struct RingChunks {
  int64_t B, N, Nkv, c, D;
  bool causal;
  RankChunks q, k;
  const int64_t* doc_start;
  RingLayout layout = RingLayout::zigzag;
  int64_t ring_size = 1;
  int64_t window = 0;  // the node's sliding window (0: none); a pair wholly before it is skipped

  // The chunks of the block ring rank `owner` sends around (what `k` is set to at each step).
  RankChunks chunks_of(int owner) const { return ring_rank_chunks(owner, ring_size, layout); }

  int64_t q_half(int a) const { return B * N * c * D * a; }     // element offsets into halves of q, o, dout
  int64_t lse_half(int a) const { return B * N * c * a; }
  int64_t kv_half(int b) const { return B * Nkv * c * D * b; }  // of k (v: + 2·kv_half(1))
  // How far query chunk a starts after key chunk b (the kernels' AttentionVariant::offset).
  int64_t offset(int a, int b) const { return ((a == 0 ? q.first : q.second) - (b == 0 ? k.first : k.second)) * c; }
  // Whether query chunk a meets key chunk b at all (a later key chunk is skipped under causal
  // masking; with a window, one whose keys all lie before its first query's window; with
  // documents, one whose keys all lie before every query's document start); if so
  // whether it is the causal diagonal, and the document starts of chunk a relative to key chunk b
  // in `docs` [B, c] (when there are documents).
  bool visits(int a, int b, bool& diagonal, std::vector<int64_t>& docs) const;
};

// The chunk geometry of a ring_attention node's call: q, k [B, H, 2c, D] (this rank's two zigzag
// chunks, or contiguous ones under the node's "layout" attribute), its ring group checked against
// the node's group_size, and `doc_start` the document starts on the host (null without documents).
// Both backends' launchers start from it.
RingChunks ring_chunks(const KernelCall& c, const Tensor& q, const Tensor& k, const int64_t* doc_start);

// Called once per step with the ring rank whose block `kv` is, and `progress`, which the step
// calls between its pieces of work so a transfer in flight advances (MPI progresses only inside
// MPI calls).
using RingStep = std::function<void(int owner, const Tensor& kv, const std::function<void()>& progress)>;

// Forward: `kv` holds this rank's block; `spare` (same bytes) receives the next. Both are
// overwritten along the way.
void ring_forward(Communicator& ring, Tensor kv, Tensor spare, const RingStep& step);

// Backward: as ring_forward, and `grad_step(owner, kv, part, progress)` writes into `part` the
// gradient of the block it holds (overwriting it); `add(into, from)` adds one gradient buffer to
// another. `grads[0..2]` are three buffers of the gradient's bytes; on return grads[0] holds this
// rank's whole gradient of its own block.
using RingGradStep =
    std::function<void(int owner, const Tensor& kv, Tensor& part, const std::function<void()>& progress)>;
void ring_backward(Communicator& ring, Tensor kv, Tensor spare, Tensor grads[3], const RingGradStep& grad_step,
                   const std::function<void(Tensor& into, const Tensor& from)>& add);

}  // namespace autosp
