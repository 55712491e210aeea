// shard_seq_dim: every transitive consumer of the tagged inputs gets S → S//P (with a ring:
// 2·(S//(2P)), autosp.h) in its attributes
// (reshape targets, slice bounds: the shapes the model spelled with S). Before rewriting, it follows
// the sequence dim through the graph and rejects any node that reduces or contracts over it outside
// attention (a softmax or norm over S, a matmul contracting S, a slice or concat along S), naming
// the node: such a graph would compute something else once each rank holds only S/P positions.
// Where each op puts the sequence, and what it rejects, is a column of the op table (OpInfo::seq).
#include <algorithm>
#include <map>

#include "graph/passes/autosp/autosp.h"
#include "tensor/check.h"

namespace autosp::passes {
namespace {

[[noreturn]] void reject(const Node& n, int dim, const std::string& why) {
  throw UsageError(str("shard_seq_dim: %", n.name(), " (", n.op_name(), ") ", why, " the sequence dimension (dim ", dim,
                       " of ", n.input(0)->type().str(), ") outside attention; AutoSP cannot shard it"));
}

// Which dim of `n`'s output is the sequence: kNoSeq when no input carries it, else what the op's row
// says (ops.h: OpInfo::seq). An op without a rule fails closed.
int seq_dim_of(const Node& n, const std::vector<int>& in, const std::string& seq) {
  if (std::all_of(in.begin(), in.end(), [](int d) { return d == kNoSeq; })) return kNoSeq;
  const SeqFn rule = op_info(n.op()).seq;
  if (!rule) reject(n, in[0] == kNoSeq ? 0 : in[0], "is not known to be local along");
  const SeqVerdict v = rule(n, in, seq);
  if (!v.rejects.empty()) reject(n, v.dim, std::string(v.rejects));
  return v.dim;
}

Dim shard(const Dim& d, const PassContext& ctx) { return d.substitute(ctx.seq, rank_seq(ctx)); }

}  // namespace

PassResult shard_seq_dim(Graph& g, const PassContext& ctx) {
  PassResult res;
  if (ctx.sp_size == 1) return res;
  std::map<const Node*, int> seq;  // consumers of the tagged inputs → their sequence dim
  for (Role role : {Role::input_ids, Role::labels, Role::position_ids, Role::pair_ids})
    for (Node* n : g.with_role(role)) seq[n] = 1;
  for (const auto& up : g.nodes()) {
    Node& n = *up;
    if (seq.count(&n) || n.inputs().empty()) continue;
    std::vector<int> in;
    bool consumer = false;
    for (Node* i : n.inputs()) {
      auto it = seq.find(i);
      in.push_back(it == seq.end() ? kNoSeq : it->second);
      consumer |= it != seq.end();
    }
    if (!consumer) continue;
    seq[&n] = seq_dim_of(n, in, ctx.seq);
    for (auto& [key, value] : n.attrs().map()) {
      if (auto* d = std::get_if<Dim>(&value); d && d->contains(ctx.seq)) {
        *d = shard(*d, ctx);
        res.changed = true;
      } else if (auto* ds = std::get_if<std::vector<Dim>>(&value)) {
        for (auto& x : *ds)
          if (x.contains(ctx.seq)) {
            x = shard(x, ctx);
            res.changed = true;
          }
      }
    }
  }
  return res;
}

}  // namespace autosp::passes
