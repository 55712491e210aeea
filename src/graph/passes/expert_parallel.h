// expert_parallel (moe.expert_parallel_size G > 1; after the AutoSP passes, before ZeRO-3 and
// autograd): every mixture-of-experts node
//   y = moe_experts(x, probs, E gates, E ups, E downs)            x [B, S/P, C], probs [B, S/P, E]
// becomes
//   y = moe_experts_ep(x, probs, L gates, L ups, L downs, group=ep, group_size=G)
// (gpt-oss's experts: their L gate, up and down biases after the weights, and the activation's
// attributes kept, so the owner applies them: engine/expert_parallel.h)
// with L = E / G: rank g of its expert group keeps experts [g·L, (g+1)·L) and the other experts'
// parameter nodes are erased, so the rank holds and trains 1/G of the experts (checkpoints still
// hold them all: train/train_state.cpp ParamGroups gathers them). The
// router is untouched (every rank routes its own tokens over all E experts, so the router's
// gradient is exact); the op's launcher sends each token to its experts' rank and back
// (engine/expert_parallel.h), and its vjp does the same for the backward. A local expert's weight
// gradient is then the sum over the expert group's tokens; the trainer sums it over the ranks
// holding the same experts (the "ep_replica" group, comm/mesh.h). G must divide every MoE node's
// experts (the config says so first, naming moe.expert_parallel_size). A no-op at G = 1.
//
// Under ZeRO (decision 185) an expert parameter's data-parallel group is its expert-replica group,
// not the world: shard_parameters shards and gathers it there, and the trainer's states shard its
// moments there. expert_of is the one rule that says which parameters are experts.
#pragma once

#include <cstdint>
#include <string_view>

#include "graph/passes/pass.h"

namespace autosp {

// The expert index in a parameter's name ("...experts.<e>...." as every MoE family names its
// expert weights: models/moe.h moe_expert_weight), or -1 for any other parameter.
int64_t expert_of(std::string_view name);

namespace passes {
PassResult expert_parallel(Graph& g, const PassContext& ctx);
}  // namespace passes

}  // namespace autosp
