// Which rank holds an expert and which group shards it (train/expert_split.h).
#include "train/expert_split.h"

#include "graph/passes/expert_parallel.h"  // expert_of
#include "train/optimizer.h"                // parameter_shard

namespace autosp {

ExpertSplit::ExpertSplit(const Config& cfg, const RankLayout& layout)
    : ep_(cfg.moe.expert_parallel_size), ep_rank_(layout.ep_rank), world_(layout.world_size),
      world_rank_(layout.world_rank) {
  if (on()) experts_per_rank_ = cfg.model.num_experts / ep_;
}

bool ExpertSplit::is_expert(const std::string& name) const { return on() && expert_of(name) >= 0; }

int ExpertSplit::owner(const std::string& name) const { return static_cast<int>(expert_of(name) / experts_per_rank_); }

Tensor ExpertSplit::zero3_shard(const std::string& name, const Tensor& whole) const {
  if (!is_expert(name)) return parameter_shard(whole, world_, world_rank_);
  // The expert-replica group: the ranks with this ep_rank, world_rank / E its index in it.
  return parameter_shard(whole, world_ / static_cast<int>(ep_), world_rank_ / static_cast<int>(ep_));
}

ParamMap ExpertSplit::zero3_shards(const ParamMap& whole) const {
  ParamMap out;
  for (const auto& [name, t] : whole)
    if (held(name)) out[name] = zero3_shard(name, t);
  return out;
}

}  // namespace autosp
