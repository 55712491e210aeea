// insert_ring_attention: with a ring (ring_size R > 1), every attention node
//   o = sdpa(q, k, v [, doc_start] [, sinks])   q [B, N/U, S/R, D], k, v [B, Nkv/U (or 1), S/R, D]
// (after the Ulysses all-to-alls, which gave each rank its ring rank's zigzag chunks) becomes
//   o = ring_attention(q, k, v [, doc_start] [, sinks], group=ring, group_size=R)
// whose kernel passes the K/V blocks around the R ranks of the ring group (engine/ring.h) at their
// own width (GQA: never replicated for the ring) and merges the partial results by log-sum-exp.
// Its vjp is ring_attention_backward (dK, dV travel back around the ring). Document starts are
// global positions, so the ring compares them with each block's place in the sequence. Sinks join
// each query's softmax once, on the chunk pair of its own chunk (engine/ring.h). A no-op
// without a ring.
#include "graph/passes/autosp/autosp.h"

#include "graph/builder.h"

namespace autosp::passes {

PassResult insert_ring_attention(Graph& g, const PassContext& ctx) {
  PassResult res;
  if (ctx.ring_size == 1) return res;
  std::vector<Node*> attn;
  for (const auto& n : g.nodes())
    if (n->op() == Op::sdpa) attn.push_back(n.get());
  for (Node* n : attn) {
    Node* ring = g.insert_after(n, Op::ring_attention, n->inputs(),
                                {{"causal", n->attrs().b("causal")},
                                 {"scale", n->attrs().f("scale")},
                                 {"group", std::string("ring")},
                                 {"group_size", ctx.ring_size}},
                                n->name() + ".ring", Role::none, n->type());
    set_attention_attrs(ring, attention_attrs(*n));
    g.replace_all_uses_with(n, ring, ring);
    g.erase(n);
    res.changed = true;
  }
  return res;
}

}  // namespace autosp::passes
