// Expert parallelism's split of a model's parameters, as the training state and ZeRO see it
// (decisions 162 and 185). With moe.expert_parallel_size E > 1, rank g of an expert group holds
// the dense parameters and experts [g·L, (g+1)·L) of every MoE layer (L = experts / E; the
// expert_parallel pass erased the others from its program). A parameter's data-parallel group,
// the ranks that sum its gradient and share its ZeRO state, is the world for a dense parameter and
// the expert-replica group (the world / E ranks holding the same experts, comm/mesh.h) for an
// expert. Without expert parallelism every parameter is dense and held. Knows nothing of graphs,
// communicators or ZeRO stages.
#pragma once

#include <cstdint>
#include <string>

#include "comm/mesh.h"
#include "config/config.h"
#include "tensor/tensor.h"

namespace autosp {

class ExpertSplit {
 public:
  ExpertSplit(const Config& cfg, const RankLayout& layout);

  bool on() const { return ep_ > 1; }
  bool is_expert(const std::string& name) const;
  // The rank of the expert group that holds expert parameter `name`.
  int owner(const std::string& name) const;
  // Whether this rank holds `name` (every dense parameter, its own experts).
  bool held(const std::string& name) const { return !is_expert(name) || owner(name) == ep_rank_; }

  // ZeRO-3 (graph/passes/shard_parameters.h): this rank's shard of whole parameter `name`, over
  // its data-parallel group.
  Tensor zero3_shard(const std::string& name, const Tensor& whole) const;
  // The tensors of `whole` this rank holds, each as its ZeRO-3 shard (what a ZeRO-3 program's
  // parameter and frozen nodes are fed).
  ParamMap zero3_shards(const ParamMap& whole) const;

 private:
  int64_t ep_ = 1, experts_per_rank_ = 1;
  int ep_rank_ = 0, world_ = 1, world_rank_ = 0;
};

}  // namespace autosp
