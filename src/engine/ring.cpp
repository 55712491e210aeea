// Ring attention's schedule: the loops of engine/ring.h.
#include "engine/ring.h"

#include <algorithm>
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

}  // namespace

Tensor halves_view(const Tensor& x) {
  const int64_t B = x.dim(0), H = x.dim(1), L = x.dim(2), D = x.rank() == 4 ? x.dim(3) : 1, c = L / 2;
  return x.as_strided({2, B, H, c, D}, {c * D, H * L * D, L * D, D, 1}, 0);
}

Tensor interleaved_view(const Tensor& halves) {
  const int64_t B = halves.dim(1), H = halves.dim(2), c = halves.dim(3), D = halves.dim(4);
  return halves.as_strided({B, H, 2, c, D}, {H * c * D, c * D, B * H * c * D, D, 1}, 0);
}

bool RingChunks::visits(int a, int b, bool& diagonal, std::vector<int64_t>& docs) const {
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
      docs[static_cast<size_t>(bi * c + i)] = d;
      first = std::min(first, d);
    }
  return first < c;  // some query sees a key of this chunk
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

}  // namespace autosp
