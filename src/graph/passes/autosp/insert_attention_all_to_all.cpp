// insert_attention_all_to_all: Ulysses all-to-alls around every attention node. With P ranks:
//   q [B, N, S/P, D] → all_to_all(scatter heads=1, gather seq=2) → [B, N/P, S, D]
//   k, v [B, Nkv, S/P, D]: all-to-all'd the same way when Nkv % P == 0; when Nkv < P (and P % Nkv == 0)
//     each kv head is first repeated P/Nkv times, so rank r receives kv head r·Nkv/P, the one its
//     query heads read; otherwise an error
//   o [B, N/P, S, D] → all_to_all(scatter seq=2, gather heads=1) → [B, N, S/P, D]
//   doc_start [B, S/P] (packed documents, sdpa's input 3): every rank needs the full [B, S] for the
//     heads it holds, so once per graph: [B, 1, S/P] → P copies [B, P, S/P] → all_to_all(scatter
//     1, gather 2) → [B, 1, S] → [B, S], read by every sdpa (B·S integers, against B·N·S·D values)
//   sinks [N] (gpt-oss, the last optional input): Ulysses rank u holds query heads [u·N/P, (u+1)·N/P),
//     so it reads that slice of them; the slice's vjp writes its heads' gradient into a zero [N],
//     which the world's gradient all-reduce sums into the whole
// A graph without attention is an error: AutoSP has nothing to parallelise.
// With a ring (ring_size R > 1) all of this runs over the U = P/R ranks of the Ulysses group
// ("ulysses"), gathering the ring rank's zigzag chunks, and insert_ring_attention then rings sdpa.
#include "graph/passes/autosp/autosp.h"
#include <map>

#include "graph/builder.h"  // attention_inputs
#include "tensor/check.h"

namespace autosp::passes {
namespace {

Node* a2a(Graph& g, Node* after, Node* x, int scatter, int gather, int64_t p, const std::string& group,
          const std::string& name) {
  return g.insert_after(after, Op::all_to_all, {x},
                        {{"scatter_dim", int64_t{scatter}}, {"gather_dim", int64_t{gather}}, {"group", group}, {"group_size", p}},
                        name);
}

// x [B, Nkv, S/P, D] → [B, P, S/P, D] with head j = kv head j / (P/Nkv), inserted after x: one
// slice per kv head, each repeated P/Nkv times, concatenated (no attribute names the sequence).
Node* repeat_heads(Graph& g, Node* x, int64_t nkv, int64_t p) {
  std::vector<Node*> heads;
  Node* at = x;
  for (int64_t h = 0; h < nkv; ++h) {
    at = g.insert_after(at, Op::slice, {x}, {{"dim", int64_t{1}}, {"start", Dim(h)}, {"end", Dim(h + 1)}},
                        x->name() + ".h" + std::to_string(h));
    heads.insert(heads.end(), static_cast<size_t>(p / nkv), at);
  }
  return g.insert_after(at, Op::concat, heads, {{"dim", int64_t{1}}}, x->name() + ".rep");
}

// d [B, S/P] → the full [B, S] on every rank (with a ring: the ring rank's [B, S/R]), inserted after d.
Node* gather_seq(Graph& g, Node* d, int64_t p, const PassContext& ctx) {
  const Dim batch = d->shape()[0], local = rank_seq(ctx);
  const Dim full_seq = ctx.ring_size == 1 ? Dim::sym(ctx.seq) : Dim(p) * local;
  Node* at = g.insert_after(d, Op::reshape, {d}, {{"shape", SymShape{batch, Dim(1), local}}}, d->name() + ".view");
  Node* copies = g.insert_after(at, Op::concat, std::vector<Node*>(static_cast<size_t>(p), at), {{"dim", int64_t{1}}},
                                d->name() + ".rep");
  Node* full = a2a(g, copies, copies, 1, 2, p, ulysses_group(ctx), d->name() + ".a2a");
  return g.insert_after(full, Op::reshape, {full}, {{"shape", SymShape{batch, full_seq}}}, d->name() + ".full");
}

// "autosp_size P", or with a ring "Ulysses degree U (autosp_size P / ring_size R)": what the heads must fit.
std::string degree(const PassContext& ctx, int64_t p) {
  if (ctx.ring_size == 1) return str("autosp_size ", p);
  return str("Ulysses degree ", p, " (autosp_size ", ctx.sp_size, " / ring_size ", ctx.ring_size, ")");
}
// Where Ulysses alone cannot shard the heads, ring attention can.
std::string ring_hint(const PassContext& ctx) {
  return ctx.ring_size == 1 ? "; sequence_parallel.ring_size (or \"auto\") rings the ranks the heads cannot take" : "";
}

}  // namespace

PassResult insert_attention_all_to_all(Graph& g, const PassContext& ctx) {
  PassResult res;
  std::vector<Node*> attn;
  for (const auto& n : g.nodes())
    if (n->op() == Op::sdpa) attn.push_back(n.get());
  if (attn.empty())
    throw UsageError("insert_attention_all_to_all: the graph has no attention node (sdpa, or matmul → softmax → matmul "
                     "attention); AutoSP shards the sequence around attention and needs one");
  const int64_t p = ctx.sp_size / ctx.ring_size;  // the Ulysses degree U
  if (p == 1) return res;
  const std::string group = ulysses_group(ctx);
  std::map<Node*, Node*> gathered;  // document starts [B, S/P] → their full [B, S]
  for (Node* n : attn) {
    const AttentionInputs opt = attention_inputs(*n);
    if (Node* d = opt.doc_start) {
      auto it = gathered.find(d);
      if (it == gathered.end()) it = gathered.emplace(d, gather_seq(g, d, p, ctx)).first;
      g.replace_input(n, opt.first, it->second);
    }
    Node *q = n->input(0), *k = n->input(1);
    const Dim& nq = q->shape()[1];
    const Dim& nk = k->shape()[1];
    if (!nq.is_const() || !nk.is_const())
      throw UsageError(str("insert_attention_all_to_all: %", n->name(), " has symbolic head counts ", nq.str(), ", ", nk.str()));
    const int64_t heads = nq.value(), kv_heads = nk.value();
    if (heads % p != 0)
      throw UsageError(str("insert_attention_all_to_all: %", n->name(), " has ", heads, " attention heads, not divisible by ",
                           degree(ctx, p), ring_hint(ctx)));
    g.replace_input(n, 0, a2a(g, q, q, 1, 2, p, group, q->name() + ".a2a"));
    if (Node* sinks = opt.sinks) {
      const int64_t u = ctx.sp_rank % p, own = heads / p;  // comm/mesh.h: ulysses_rank = sp_rank % U
      g.replace_input(n, n->inputs().size() - 1,
                      g.insert_after(sinks, Op::slice, {sinks},
                                     {{"dim", int64_t{0}}, {"start", Dim(u * own)}, {"end", Dim((u + 1) * own)}},
                                     sinks->name() + ".heads"));
    }
    for (size_t i : {size_t{1}, size_t{2}}) {
      Node* x = n->input(i);
      Node* src = x;
      if (kv_heads % p != 0) {
        if (kv_heads > p || p % kv_heads != 0)
          throw UsageError(str("insert_attention_all_to_all: %", n->name(), " has ", kv_heads,
                               " key/value heads: with ", degree(ctx, p), " they must be a multiple of ", p,
                               " (all-to-all) or divide it (replicated)", ring_hint(ctx)));
        src = repeat_heads(g, x, kv_heads, p);
      }
      g.replace_input(n, i, a2a(g, src, src, 1, 2, p, group, x->name() + ".a2a"));
    }
    Node* out = a2a(g, n, n, 2, 1, p, group, n->name() + ".a2a");
    g.replace_all_uses_with(n, out, out);
    res.changed = true;
  }
  return res;
}

}  // namespace autosp::passes
