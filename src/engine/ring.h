// Ring attention's schedule (the ring_attention and ring_attention_backward ops, made by
// graph/passes/autosp/insert_ring_attention): which blocks a ring rank holds, which keys of them
// another rank needs, and the loops that move them, shared by the CPU and CUDA launchers, which
// bring the attention of one block and the tensors. Knows nothing of kernels or devices.
//
// Zigzag layout: with R ring ranks the sequence is cut into 2R chunks of c = S/(2R) and ring rank
// r holds chunks r and 2R-1-r, side by side (its local sequence). Under causal masking every rank
// then does the same attention work: at its own step two diagonal blocks and one full block, at
// every other step two full blocks. A block (a rank's K and V) is kept chunk by chunk:
// [chunk 0: k | v][chunk 1: k | v], each k, v [B, Nkv, c, D].
//
// Full ring (no window, decision 99). Forward (R steps): at step s a rank computes with the K/V
// block of ring rank (r - s) mod R while that block goes on to rank r + 1 and the next arrives
// from rank r - 1 (send_recv_async, one message per step: R - 1 in all). Backward (R steps): the
// K/V blocks travel the same way; each step's partial dK, dV (the gradient of the block it holds)
// is added to the partial that arrived from rank r - 1 and sent on to rank r + 1, so after R steps
// and R messages every rank holds the whole dK, dV of its own block. The gradient message of step
// s overlaps with step s + 1.
//
// Windowed exchange (a causal node with a sliding window w, decision 135): a query of chunk j sees
// keys of chunks j - ceil((w-1)/c) .. j only, and of the earliest of those only the last keys. So
// instead of passing whole blocks round, a rank receives from each other rank exactly the tails of
// its chunks that its own two query chunks can see (RingChunks::tails: for w <= c, the end of its
// early chunk's predecessor from rank r - 1 and of its late chunk's predecessor from rank r + 1),
// in rounds d = 1 .. R-1 (rank r sends to r + d what that rank needs and receives from r - d;
// a round in which no rank needs anything is skipped on every rank). The backward receives the
// same tails again, and sends each one's dK, dV partial straight back to its owner, which adds it
// into its own gradient. Bytes per rank and layer: O(w), not O(S/P); compute O(S/P · w).
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

// The last `keys` keys (1..c) of chunk `chunk` (0, 1: the owner's local order) of a block. A
// message of tails is [k | v] of each, [B, Nkv, keys, D] each, one after the other.
struct ChunkTail {
  int chunk;
  int64_t keys;
  bool operator==(const ChunkTail&) const = default;
};

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

  int64_t q_half(int a) const { return B * N * c * D * a; }  // element offsets into halves of q, o, dout
  int64_t lse_half(int a) const { return B * N * c * a; }
  int64_t kv_rows(int64_t keys) const { return B * Nkv * keys * D; }  // elements of k (or v) of `keys` keys
  // Whether key chunk b is query chunk a itself: the one pair of each query that carries the
  // sinks, so exp(sink) joins its softmax denominator once (every query sees its own chunk).
  bool own(int a, int b) const { return (a == 0 ? q.first : q.second) == (b == 0 ? k.first : k.second); }
  // How far query chunk a starts after key chunk b (the kernels' AttentionVariant::offset).
  int64_t offset(int a, int b) const { return ((a == 0 ? q.first : q.second) - (b == 0 ? k.first : k.second)) * c; }
  // Whether query chunk a meets key chunk b at all (a later key chunk is skipped under causal
  // masking; with a window, one whose keys all lie before its first query's window; with
  // documents, one whose keys all lie before every query's document start); if so
  // whether it is the causal diagonal, and the document starts of chunk a relative to the first
  // of the last `keys` keys of chunk b (the tail a windowed exchange brought) in `docs` [B, c]
  // (when there are documents).
  bool visits(int a, int b, bool& diagonal, std::vector<int64_t>& docs, int64_t keys) const;

  // Whether the K/V move as a windowed exchange (a causal node with a window) or round the full ring.
  bool windowed() const { return causal && window > 0; }
  // What ring rank `receiver` needs of ring rank `owner`'s block: the tails of its chunks that the
  // receiver's queries can see through the window, by causality and the window alone (the owner
  // does not know the receiver's documents). Empty when it needs nothing; for the receiver itself,
  // both whole chunks.
  std::vector<ChunkTail> tails(int owner, int receiver) const;
  // Elements of a message of `tails` ([k | v] of each tail, in order).
  int64_t elements(const std::vector<ChunkTail>& tails) const;
};

// Both whole chunks of a block: the block itself as a message of tails.
inline std::vector<ChunkTail> whole_block(int64_t c) { return {{0, c}, {1, c}}; }

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

// The windowed exchange (RingChunks::windowed), forward. `own` is this rank's block (the message
// of whole_block); `buffer(n)` makes a flat buffer of n elements of its dtype; `pack(tails, msg)`
// copies the tails of this rank's block into msg; `step(owner, tails, msg, progress)` attends this
// rank's queries to a message of tails of `owner`'s block (first its own block, then each round's).
struct TailIO {
  std::function<Tensor(int64_t elements)> buffer;
  std::function<void(const std::vector<ChunkTail>& tails, Tensor& msg)> pack;
};
using TailStep = std::function<void(int owner, const std::vector<ChunkTail>& tails, const Tensor& msg,
                                    const std::function<void()>& progress)>;
void window_forward(Communicator& ring, const RingChunks& g, const Tensor& own, const TailIO& io, const TailStep& step);

// Backward: `grad_step(owner, tails, msg, part, progress)` writes into `part` (a message of the same
// tails, in the gradient's type) the dK, dV of the tails it holds, overwriting it;
// `grad_buffer(n)` makes gradient buffers; `add_tails(own, tails, part)` adds a message of
// gradients of this rank's tails (sent back by the rank that used them) into `own`. On return
// `own` (whole_block's layout, in the gradient's type) holds this rank's whole dK, dV.
using TailGradStep = std::function<void(int owner, const std::vector<ChunkTail>& tails, const Tensor& msg,
                                        Tensor& part, const std::function<void()>& progress)>;
void window_backward(Communicator& ring, const RingChunks& g, const Tensor& own, const TailIO& io,
                     const std::function<Tensor(int64_t elements)>& grad_buffer, Tensor& own_grad,
                     const TailGradStep& grad_step,
                     const std::function<void(Tensor& own, const std::vector<ChunkTail>& tails, const Tensor& part)>&
                         add_tails);

}  // namespace autosp
