// shard_seq_dim: every transitive consumer of the tagged inputs gets S → S//P in its attributes
// (reshape targets, slice bounds: the shapes the model spelled with S). Before rewriting, it follows
// the sequence dim through the graph and rejects any node that reduces or contracts over it outside
// attention (a softmax or norm over S, a matmul contracting S, a slice or concat along S), naming
// the node: such a graph would compute something else once each rank holds only S/P positions.
#include <set>

#include "graph/passes/autosp/autosp.h"
#include "tensor/check.h"

namespace autosp::passes {
namespace {

constexpr int kNone = -1;

[[noreturn]] void reject(const Node& n, int dim, const std::string& why) {
  throw UsageError(str("shard_seq_dim: %", n.name(), " (", n.op_name(), ") ", why, " the sequence dimension (dim ", dim,
                       " of ", n.input(0)->type().str(), ") outside attention; AutoSP cannot shard it"));
}

// Which dim of `n`'s output is the sequence, from its inputs' (kNone when it has none).
int seq_dim_of(const Node& n, const std::vector<int>& in, const std::string& seq) {
  const int r = n.type().rank();
  auto any = [&] {
    for (int d : in)
      if (d != kNone) return true;
    return false;
  };
  if (!any()) return kNone;
  const auto& a = n.attrs();
  switch (n.op()) {
    case Op::add: case Op::sub: case Op::mul: case Op::div: {
      int out = kNone;
      for (size_t i = 0; i < 2; ++i) {
        if (in[i] == kNone) continue;
        int aligned = in[i] + (r - n.input(i)->type().rank());
        if (out != kNone && out != aligned) reject(n, in[i], "mixes");
        out = aligned;
      }
      return out;
    }
    case Op::scale: case Op::neg: case Op::exp: case Op::gelu_tanh: case Op::silu: case Op::cast:
      return in[0];
    case Op::causal_mask:
      if (in[0] >= r - 2) reject(n, in[0], "masks along");
      return in[0];
    case Op::embedding:
      return in[1];
    case Op::matmul: {
      const bool ta = a.b("trans_a"), tb = a.b("trans_b");
      const int ra = n.input(0)->type().rank(), rb = n.input(1)->type().rank();
      int out = kNone;
      if (in[0] != kNone) {
        const int m = ta ? ra - 1 : ra - 2, k = ta ? ra - 2 : ra - 1;
        if (in[0] == k) reject(n, in[0], "contracts over");
        out = in[0] == m ? r - 2 : in[0];
      }
      if (in[1] != kNone) {
        const int k = tb ? rb - 1 : rb - 2, nn = tb ? rb - 2 : rb - 1;
        if (in[1] == k) reject(n, in[1], "contracts over");
        out = in[1] == nn ? r - 1 : in[1] + (r - rb);
      }
      return out;
    }
    case Op::reshape: {
      int found = kNone;
      for (int d = 0; d < r; ++d)
        if (n.shape()[d].contains(seq)) {
          if (found != kNone) reject(n, in[0], "splits");
          found = d;
        }
      if (found == kNone) reject(n, in[0], "hides");
      return found;
    }
    case Op::transpose: {
      const int d0 = static_cast<int>((a.i("dim0") + r) % r), d1 = static_cast<int>((a.i("dim1") + r) % r);
      return in[0] == d0 ? d1 : in[0] == d1 ? d0 : in[0];
    }
    case Op::permute: {
      const auto& perm = a.ints("perm");
      for (int d = 0; d < r; ++d)
        if ((perm[d] + r) % r == in[0]) return d;
      return kNone;
    }
    case Op::slice:
      if ((a.i("dim") + r) % r == in[0]) reject(n, in[0], "slices along");
      return in[0];
    case Op::concat:
      for (int d : in)
        if (d == (a.i("dim") + r) % r) reject(n, d, "concatenates along");
      return in[0];
    case Op::layernorm: case Op::rmsnorm: case Op::softmax:
      if (in[0] == r - 1) reject(n, in[0], "normalises over");
      return in[0];
    case Op::rope:
      if (in[0] != kNone && in[0] != 2) reject(n, in[0], "rotates along");
      return in[0] == kNone ? 2 : in[0];
    case Op::sdpa:
      for (int d : in)
        if (d != kNone && d != 2) reject(n, d, "attends over");
      return 2;
    case Op::cross_entropy_sum: case Op::count_valid:
      return kNone;  // the loss: made exact across ranks by normalize_loss
    default:
      reject(n, in[0] == kNone ? 0 : in[0], "is not known to be local along");
  }
}

Dim shard(const Dim& d, const std::string& seq, int64_t p) { return d.substitute(seq, Dim::sym(seq).floordiv(p)); }

}  // namespace

PassResult shard_seq_dim(Graph& g, const PassContext& ctx) {
  PassResult res;
  if (ctx.sp_size == 1) return res;
  std::map<const Node*, int> seq;  // consumers of the tagged inputs → their sequence dim
  for (Role role : {Role::input_ids, Role::labels, Role::position_ids})
    for (Node* n : g.with_role(role)) seq[n] = 1;
  for (const auto& up : g.nodes()) {
    Node& n = *up;
    if (seq.count(&n) || n.inputs().empty()) continue;
    std::vector<int> in;
    bool consumer = false;
    for (Node* i : n.inputs()) {
      auto it = seq.find(i);
      in.push_back(it == seq.end() ? kNone : it->second);
      consumer |= it != seq.end();
    }
    if (!consumer) continue;
    seq[&n] = seq_dim_of(n, in, ctx.seq);
    for (auto& [key, value] : n.attrs().map()) {
      if (auto* d = std::get_if<Dim>(&value); d && d->contains(ctx.seq)) {
        *d = shard(*d, ctx.seq, ctx.sp_size);
        res.changed = true;
      } else if (auto* ds = std::get_if<std::vector<Dim>>(&value)) {
        for (auto& x : *ds)
          if (x.contains(ctx.seq)) {
            x = shard(x, ctx.seq, ctx.sp_size);
            res.changed = true;
          }
      }
    }
  }
  return res;
}

}  // namespace autosp::passes
