// ZeRO-3 (zero_optimization.stage 3) as two graph passes, the way DeepCompile does it: every
// parameter is sharded over the world and gathered where it is used (under expert parallelism an
// expert parameter over its "ep_replica" group instead, the ranks holding the same experts:
// decision 185).
//
// shard_parameters (after AutoSP, before autograd): each parameter node (LoRA's frozen ones too, which
// then get no reduce-scatter: autograd does not differentiate them) becomes this rank's shard,
// [ceil(numel / W)] elements of the flattened parameter (the last rank's padded with zeros), and
// an all_gather of the W shards into the whole parameter feeds every former user; under mixed
// precision, of the shards cast to bf16 (the cast is elementwise: the same bf16 weights at half
// the bytes on the wire and in memory). Autograd then
// differentiates the gather into a reduce_scatter of the gradient: the gradient output of each
// parameter is this rank's shard of the gradient summed over the world.
//
// regather_parameters (after autograd and activation checkpointing): the whole parameter must not
// stay alive from its first use in the forward to its last in the backward. The graph's nodes fall
// into execution units (a transformer layer of the forward, of the backward; a new unit each time
// the layer changes, and one more where the backward begins: ParameterUnits), and every unit
// that reads a parameter gets its own gather (and, under bf16, its own cast), so the executor frees
// each whole copy after the unit's last use; a unit right after the previous reading unit (the LM
// head's forward, then its backward) reads that copy, so no parameter is whole twice at once.
// A gather of a bf16 cast differentiates into a bf16 reduce_scatter and a cast of its shard to
// f32; this pass makes it one reduce_scatter(dW, sum_dtype="f32"): the bf16 gradient summed over
// the ranks in f32, as the other stages sum, into the f32 shard. No node holds a whole f32 copy
// of the gradient: the launchers cast it piece by piece into a bounded staging buffer
// (engine/dispatch.h launch::ScatterPieces, decision 102). Autograd reaches the gathers (the graph's
// first nodes) last, so it appends every reduce_scatter at the end of the backward; this pass moves
// each up to right after its whole gradient is complete, which then dies there instead of at the end.
//
// Both place every gather at the start of the unit before the one that reads it: the executor
// runs all_gather in the background (engine/executor.h), so the next layer's parameters arrive
// while this layer computes, and at most two units' whole parameters are alive at once.
#pragma once

#include <vector>

#include "graph/passes/pass.h"

namespace autosp {

// The execution units of a graph's nodes, taken once before a pass inserts or moves anything (it
// keeps node pointers): a node of layer scope s (its name, less a leading "d.", starts with
// ctx.layer_scopes[s]) starts a new unit where the scope changes; the first node of the backward
// (graph/autograd.h) starts one; other nodes belong to the unit they run in.
// A node's unit is found by its Node::id(), its position when the units were taken: inserts, moves
// and erasures keep the ids of the nodes already there, only reading the order after them
// (Graph::nodes, position) renumbers, and unit_of asserts that the id still names the node.
class ParameterUnits {
 public:
  ParameterUnits(const Graph& g, const PassContext& ctx);
  int unit_of(const Node* n) const;
  // Where a gather for `reader` goes: the first node of the unit before reader's (the prefetch),
  // or `reader` itself in the first unit.
  Node* prefetch_point(const Node* reader) const;

 private:
  std::vector<Node*> first_of_;  // per unit (numbers start at 0 and have no gaps)
  std::vector<const Node*> node_at_;  // by id, when the units were taken
  std::vector<int> unit_at_;          // the unit of node_at_[id]
};

namespace passes {
PassResult shard_parameters(Graph& g, const PassContext& ctx);
PassResult regather_parameters(Graph& g, const PassContext& ctx);
}  // namespace passes

}  // namespace autosp
