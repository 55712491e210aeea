// The shared step of shard_input_ids, shard_label_ids, shard_position_ids and shard_doc_start (the
// seed's shard_tensor_node): after each input with the role, insert
//   %x.r = slice(%x, dim=1, start=r·(S//P), end=(r+1)·(S//P))
// and make every consumer read the slice: rank r keeps the contiguous block r of the sequence.
// With a ring (ring_size R > 1) rank r keeps its zigzag units instead (autosp.h): one slice of
// 2·(S//(2P)) tokens, or, when its two units lie in two chunks (an odd Ulysses degree), two
// slices of S//(2P) concatenated.
#include "graph/passes/autosp/autosp.h"

namespace autosp {

std::vector<std::pair<int64_t, int64_t>> zigzag_units(int64_t sp_size, int64_t ring_size, int64_t sp_rank) {
  const int64_t U = sp_size / ring_size, rho = sp_rank / U, u = sp_rank % U;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t t : {2 * u, 2 * u + 1}) {  // local units of ring rank rho: chunk rho, then chunk 2R-1-rho
    const int64_t g = t < U ? rho * U + t : (2 * ring_size - 1 - rho) * U + (t - U);
    if (!out.empty() && out.back().second == g)
      out.back().second = g + 1;
    else
      out.emplace_back(g, g + 1);
  }
  return out;
}

Dim rank_seq(const PassContext& ctx) {
  const Dim s = Dim::sym(ctx.seq);
  return ctx.ring_size == 1 ? s.floordiv(ctx.sp_size) : Dim(2) * s.floordiv(2 * ctx.sp_size);
}

std::string ulysses_group(const PassContext& ctx) { return ctx.ring_size == 1 ? "sp" : "ulysses"; }

namespace passes {

PassResult shard_tagged_input(Graph& g, const PassContext& ctx, Role role) {
  PassResult res;
  if (ctx.sp_size == 1) return res;
  for (Node* x : g.with_role(role)) {
    const std::vector<Node*> readers = x->users();
    Node* s = nullptr;
    if (ctx.ring_size == 1) {
      const Dim block = Dim::sym(ctx.seq).floordiv(ctx.sp_size);
      s = g.insert_after(x, Op::slice, {x},
                         {{"dim", int64_t{1}}, {"start", Dim(ctx.sp_rank) * block}, {"end", Dim(ctx.sp_rank + 1) * block}},
                         x->name() + ".r");
    } else {
      const Dim unit = Dim::sym(ctx.seq).floordiv(2 * ctx.sp_size);
      const auto ranges = zigzag_units(ctx.sp_size, ctx.ring_size, ctx.sp_rank);
      std::vector<Node*> parts;
      Node* at = x;
      for (size_t i = 0; i < ranges.size(); ++i) {
        const auto [a, b] = ranges[i];
        const std::string name = ranges.size() == 1 ? x->name() + ".r" : x->name() + ".r" + std::to_string(i);
        at = g.insert_after(at, Op::slice, {x}, {{"dim", int64_t{1}}, {"start", Dim(a) * unit}, {"end", Dim(b) * unit}},
                            name);
        parts.push_back(at);
      }
      s = parts.size() == 1 ? parts[0] : g.insert_after(at, Op::concat, parts, {{"dim", int64_t{1}}}, x->name() + ".r");
    }
    for (Node* u : readers)
      for (size_t k = 0; k < u->inputs().size(); ++k)
        if (u->input(k) == x) g.replace_input(u, k, s);
    res.changed = true;
  }
  return res;
}

}  // namespace passes
}  // namespace autosp
