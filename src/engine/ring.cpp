// Ring attention's schedule: the loops of engine/ring.h (the full ring and the windowed exchange).
#include "engine/ring.h"

#include <algorithm>
#include <array>
#include <memory>
#include <utility>

#include "tensor/check.h"

namespace autosp {
namespace {

struct Neighbours {
  int rank, size, next, prev;
};
Neighbours neighbours(const Communicator& ring) {
  const int r = ring.rank(), R = ring.size();
  return {r, R, (r + 1) % R, (r + R - 1) % R};
}

// Calls test() on what is in flight (it never blocks).
std::function<void()> progress_of(const std::unique_ptr<PendingCollective>& a,
                                  const std::unique_ptr<PendingCollective>& b = nullptr) {
  return [&a, &b] {
    if (a) a->test();
    if (b) b->test();
  };
}

// One round of the windowed exchange: this rank sends `send` (tails of its block) to `dest` and
// receives `recv` (tails of src's block) from `src`.
struct Round {
  int dest, src;
  std::vector<ChunkTail> send, recv;
};

// The rounds d = 1 .. R-1 in which some rank needs something of the rank d before it: the same
// list on every rank (each rank skips the same rounds).
std::vector<Round> window_rounds(const RingChunks& g, int rank, int R) {
  std::vector<Round> rounds;
  for (int d = 1; d < R; ++d) {
    bool any = false;
    for (int r = 0; r < R && !any; ++r) any = !g.tails((r - d + R) % R, r).empty();
    if (!any) continue;
    const int dest = (rank + d) % R, src = (rank - d + R) % R;
    rounds.push_back({dest, src, g.tails(rank, dest), g.tails(src, rank)});
  }
  return rounds;
}

// The first `n` elements of `buf`, flat.
Tensor prefix(const Tensor& buf, int64_t n) { return Tensor::view_bytes(buf, 0, {n}, buf.dtype()); }

// The elements of the largest message `size(round)` of any round (at least 1).
int64_t largest(const std::vector<Round>& rounds, const std::function<int64_t(const Round&)>& size) {
  int64_t n = 1;
  for (const Round& r : rounds) n = std::max(n, size(r));
  return n;
}

// Two buffers (alternate rounds) of the largest message `size(round)` of any round.
std::array<Tensor, 2> round_buffers(const std::vector<Round>& rounds, const std::function<int64_t(const Round&)>& size,
                                    const std::function<Tensor(int64_t)>& make) {
  const int64_t n = largest(rounds, size);
  return {make(n), make(n)};
}

// Starts round i's K/V message: this rank's tails packed into send[i % 2], the tails it needs into recv[i % 2].
std::unique_ptr<PendingCollective> start_round(Communicator& ring, const RingChunks& g, const std::vector<Round>& rounds,
                                               size_t i, const TailIO& io, std::array<Tensor, 2>& send,
                                               std::array<Tensor, 2>& recv) {
  if (i >= rounds.size()) return nullptr;
  const Round& r = rounds[i];
  Tensor out = prefix(send[i % 2], g.elements(r.send)), in = prefix(recv[i % 2], g.elements(r.recv));
  io.pack(r.send, out);
  return ring.send_recv_async(out, r.dest, in, r.src);
}

}  // namespace

Tensor halves_view(const Tensor& x) {
  const int64_t B = x.dim(0), H = x.dim(1), L = x.dim(2), D = x.rank() == 4 ? x.dim(3) : 1, c = L / 2;
  return x.as_strided({2, B, H, c, D}, {c * D, H * L * D, L * D, D, 1}, 0);
}

Tensor interleaved_view(const Tensor& halves) {
  const int64_t B = halves.dim(1), H = halves.dim(2), c = halves.dim(3), D = halves.dim(4);
  return halves.as_strided({B, H, 2, c, D}, {H * c * D, c * D, B * H * c * D, D, 1}, 0);
}

bool RingChunks::visits(int a, int b, bool& diagonal, std::vector<int64_t>& docs, int64_t keys) const {
  const int64_t qa = a == 0 ? q.first : q.second, kb = b == 0 ? k.first : k.second;
  if (causal && kb > qa) return false;
  diagonal = causal && kb == qa;
  if (window > 0 && (qa - kb) * c >= c + window - 1) return false;  // last key kb·c + c - 1 < qa·c - window + 1
  if (doc_start == nullptr) return true;
  docs.resize(static_cast<size_t>(B * c));
  int64_t first = c;
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t i = 0; i < c; ++i) {
      const int64_t d = doc_start[bi * 2 * c + a * c + i] - kb * c;
      docs[static_cast<size_t>(bi * c + i)] = d - (c - keys);
      first = std::min(first, d);
    }
  return first < c;  // some query sees a key of this chunk
}

std::vector<ChunkTail> RingChunks::tails(int owner, int receiver) const {
  if (owner == receiver) return whole_block(c);
  const RankChunks o = chunks_of(owner), r = chunks_of(receiver);
  std::vector<ChunkTail> out;
  for (int b = 0; b < 2; ++b) {
    const int64_t kb = b == 0 ? o.first : o.second;
    int64_t keys = 0;
    for (const int64_t qa : {r.first, r.second}) {
      if (causal && kb > qa) continue;
      // The first query of chunk qa (at qa·c) sees keys from qa·c - window + 1 on; the later ones fewer.
      const int64_t from = window > 0 ? std::max(kb * c, qa * c - window + 1) : kb * c;
      keys = std::max(keys, kb * c + c - from);
    }
    if (keys > 0) out.push_back({b, std::min(keys, c)});
  }
  return out;
}

int64_t RingChunks::elements(const std::vector<ChunkTail>& tails) const {
  int64_t n = 0;
  for (const ChunkTail& t : tails) n += 2 * kv_rows(t.keys);
  return n;
}

RingChunks ring_chunks(const KernelCall& c, const Tensor& q, const Tensor& k, const int64_t* doc_start) {
  AUTOSP_ASSERT(c.comm, c.node.op_name(), " without a communicator");
  const int64_t R = c.node.attrs().i("group_size");
  AUTOSP_ASSERT(c.comm->size() == R, c.node.name(), ": ring of ", R, " ranks, group '", c.node.attrs().s("group"),
                "' has ", c.comm->size());
  AUTOSP_ASSERT(q.dim(2) % 2 == 0 && q.dim(2) == k.dim(2), c.node.name(), ": local sequence ", q.dim(2), " vs keys ",
                k.dim(2), " (two zigzag chunks of equal length)");
  RingLayout layout = RingLayout::zigzag;
  if (c.node.attrs().has("layout")) {
    const std::string& name = c.node.attrs().s("layout");
    AUTOSP_ASSERT(name == "zigzag" || name == "contiguous", c.node.name(), ": layout '", name,
                  "' (expected zigzag or contiguous)");
    if (name == "contiguous") layout = RingLayout::contiguous;
  }
  RingChunks g{q.dim(0), q.dim(1), k.dim(1), q.dim(2) / 2, q.dim(3), c.node.attrs().b("causal"), {}, {}, doc_start,
               layout, R, c.node.attrs().has("window") ? c.node.attrs().i("window") : 0};
  g.q = g.chunks_of(c.comm->rank());
  g.k = g.chunks_of(0);
  return g;
}

void ring_forward(Communicator& ring, Tensor kv, Tensor spare, const RingStep& step) {
  const Neighbours n = neighbours(ring);
  for (int s = 0; s < n.size; ++s) {
    std::unique_ptr<PendingCollective> moving;
    if (s + 1 < n.size) moving = ring.send_recv_async(kv, n.next, spare, n.prev);
    step((n.rank - s + n.size) % n.size, kv, progress_of(moving));
    if (moving) {
      moving->wait();
      std::swap(kv, spare);
    }
  }
}

void ring_backward(Communicator& ring, Tensor kv, Tensor spare, Tensor grads[3], const RingGradStep& grad_step,
                   const std::function<void(Tensor& into, const Tensor& from)>& add) {
  const Neighbours n = neighbours(ring);
  // grads[0]: what arrives; parts[0], parts[1]: this step's partial and the one still being sent.
  Tensor& in = grads[0];
  Tensor parts[2] = {grads[1], grads[2]};
  std::unique_ptr<PendingCollective> sending;
  for (int s = 0; s < n.size; ++s) {
    std::unique_ptr<PendingCollective> moving;
    if (s + 1 < n.size) moving = ring.send_recv_async(kv, n.next, spare, n.prev);
    Tensor& part = parts[s % 2];
    grad_step((n.rank - s + n.size) % n.size, kv, part, progress_of(moving, sending));
    if (sending) {  // the partial of step s - 1, summed over the ranks before this one
      sending->wait();
      add(part, in);
    }
    sending = ring.send_recv_async(part, n.next, in, n.prev);
    if (moving) {
      moving->wait();
      std::swap(kv, spare);
    }
  }
  sending->wait();  // the gradient of this rank's own block, complete
}

void window_forward(Communicator& ring, const RingChunks& g, const Tensor& own, const TailIO& io, const TailStep& step) {
  const std::vector<Round> rounds = window_rounds(g, ring.rank(), ring.size());
  std::array<Tensor, 2> send = round_buffers(rounds, [&](const Round& r) { return g.elements(r.send); }, io.buffer);
  std::array<Tensor, 2> recv = round_buffers(rounds, [&](const Round& r) { return g.elements(r.recv); }, io.buffer);
  std::unique_ptr<PendingCollective> moving = start_round(ring, g, rounds, 0, io, send, recv);
  step(ring.rank(), whole_block(g.c), own, progress_of(moving));
  for (size_t i = 0; i < rounds.size(); ++i) {
    std::unique_ptr<PendingCollective> next = start_round(ring, g, rounds, i + 1, io, send, recv);
    moving->wait();
    step(rounds[i].src, rounds[i].recv, prefix(recv[i % 2], g.elements(rounds[i].recv)), progress_of(next));
    moving = std::move(next);
  }
}

void window_backward(Communicator& ring, const RingChunks& g, const Tensor& own, const TailIO& io,
                     const std::function<Tensor(int64_t elements)>& grad_buffer, Tensor& own_grad,
                     const TailGradStep& grad_step,
                     const std::function<void(Tensor& own, const std::vector<ChunkTail>& tails, const Tensor& part)>&
                         add_tails) {
  const std::vector<Round> rounds = window_rounds(g, ring.rank(), ring.size());
  std::array<Tensor, 2> send = round_buffers(rounds, [&](const Round& r) { return g.elements(r.send); }, io.buffer);
  std::array<Tensor, 2> recv = round_buffers(rounds, [&](const Round& r) { return g.elements(r.recv); }, io.buffer);
  // parts: the gradients of the tails received (this round's, and the last one's still being
  // sent back); back: the gradients of this rank's tails that a receiver returns.
  std::array<Tensor, 2> parts = round_buffers(rounds, [&](const Round& r) { return g.elements(r.recv); }, grad_buffer);
  const Tensor back = grad_buffer(largest(rounds, [&](const Round& r) { return g.elements(r.send); }));
  std::unique_ptr<PendingCollective> moving = start_round(ring, g, rounds, 0, io, send, recv), returning;
  grad_step(ring.rank(), whole_block(g.c), own, own_grad, progress_of(moving));
  for (size_t i = 0; i < rounds.size(); ++i) {
    const Round& r = rounds[i];
    std::unique_ptr<PendingCollective> next = start_round(ring, g, rounds, i + 1, io, send, recv);
    moving->wait();
    Tensor part = prefix(parts[i % 2], g.elements(r.recv));
    grad_step(r.src, r.recv, prefix(recv[i % 2], g.elements(r.recv)), part, progress_of(next, returning));
    if (returning) {  // the gradients of the tails this rank sent in round i - 1
      returning->wait();
      add_tails(own_grad, rounds[i - 1].send, prefix(back, g.elements(rounds[i - 1].send)));
    }
    Tensor in = prefix(back, g.elements(r.send));
    returning = ring.send_recv_async(part, r.src, in, r.dest);  // back to the owner; ours from whom we sent to
    moving = std::move(next);
  }
  if (returning) {
    returning->wait();
    add_tails(own_grad, rounds.back().send, prefix(back, g.elements(rounds.back().send)));
  }
}

}  // namespace autosp
