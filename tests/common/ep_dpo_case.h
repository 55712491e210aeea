// DPO (train.objective "dpo") under expert parallelism, shared by the thread-rank test
// (tests/comm/test_thread_ep_dpo.cpp) and the MPI one (tests/mpi/test_ep.cpp): preference windows
// written byte by byte as scripts/prepare_data.py --preference lays them out (each 16-token window
// one pair, chosen then rejected, a 3-token prompt each, and a pad), a rank's DPO config under an
// EpLayout (tests/common/ep_case.h) on them, and the comparison with the one-process run: every
// step's loss and gradient norm, TRL's metrics the step logs (rewards/chosen, rejected, margins,
// accuracies, logps/chosen, rejected) and the final whole weights (check_train_like; CHECK-based
// past its step count, so an MPI rank that fails still meets the others' collectives). The
// one-process DPO run is itself checked against TRL's formulas by tests/ref/hf_dpo.py, and the
// one-process MoE against transformers by tests/ref/hf_moe.py.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/ep_case.h"
#include "common/loss_mask_files.h"
#include "common/temp_dir.h"

namespace autosp::test {

// Six windows of 16 tokens: pair w's chosen (8 tokens) and rejected (7 tokens) sequences, each a
// 3-token prompt and its completion (masked in), then one pad (pair id 0, masked out).
inline void write_ep_pairs(const TempDir& dir) {
  std::vector<int64_t> tokens, mask;
  std::vector<int32_t> pairs;
  for (int w = 0; w < 6; ++w) {
    for (int side = 0; side < 2; ++side)
      for (int t = 0; t < 8 - side; ++t) {
        tokens.push_back(1 + (w * 7 + side * 13 + t * 5) % 60);
        mask.push_back(t >= 3);
        pairs.push_back(side == 0 ? w + 1 : -(w + 1));
      }
    tokens.push_back(0), mask.push_back(0), pairs.push_back(0);
  }
  tokens.push_back(0), mask.push_back(0), pairs.push_back(0);  // the last window's next token
  write_shard(dir.path("train_000000.bin"), tokens);
  write_bytes(dir.path("train_000000.npy"), npy_mask(mask));
  write_bytes(dir.path("pairs_train_000000.npy"), npy_i32(pairs));
}

// A rank's DPO config under `l` at ZeRO `stage`: 2 windows per step in all (2 / dp per dp rank),
// 3 steps, the MoE `model`; `extra` is merged over it (dpo.precompute_ref, lora, ...).
inline Config ep_dpo_config(const TempDir& dir, const json& model, const EpLayout& l, int64_t stage,
                            const json& extra = json::object()) {
  const int64_t dp = l.world / l.sp;
  json j = {{"model", model},
            {"data", {{"source", "tokens"}, {"path", dir.path("train_*.bin")}, {"loss_mask_path", dir.path("train_*.npy")},
                      {"pairs_path", dir.path("pairs_train_*.npy")}, {"seq_len", 16}, {"batch_size", 2 / dp}}},
            {"train", {{"steps", 3}, {"objective", "dpo"}, {"lr", 2e-2}, {"warmup_steps", 1}, {"min_lr", 1e-3},
                       {"grad_clip", 0.5}}},
            {"dpo", {{"beta", 0.5}}},
            {"sequence_parallel", {{"autosp_size", l.sp}, {"ring_size", l.ring}}},
            {"moe", {{"expert_parallel_size", l.ep}}},
            {"zero_optimization", {{"stage", stage}}},
            {"runtime", {{"dtype", "float32"}, {"threads", 1}, {"activation_checkpointing", l.checkpointing},
                         {"grad_bucket_mb", 0.01}}}};
  j.merge_patch(extra);
  return parse_config(j);
}

// A rank's DPO run against the one-process one: check_train_like, and TRL's six metrics of every
// step within 1e-4 · (1 + |value|). rewards/accuracies from step 2 on: at step 1 the policy is the
// reference, so every margin is 0 up to the sums' rounding, which another layout tips.
inline void check_dpo_like(const TrainResult& got, const TrainResult& ref) {
  check_train_like(got, ref);
  for (size_t k = 0; k < ref.steps.size() && k < got.steps.size(); ++k) {
    INFO("step " << k + 1);
    std::map<std::string, double> mine(got.steps[k].objective_metrics.begin(), got.steps[k].objective_metrics.end());
    CHECK(ref.steps[k].objective_metrics.size() == 6);
    CHECK(mine.size() == 6);
    for (const auto& [name, want] : ref.steps[k].objective_metrics) {
      INFO(name);
      if (name == "rewards/accuracies" && k == 0) continue;
      CHECK(mine.count(name) == 1);
      if (mine.count(name)) CHECK(std::abs(mine.at(name) - want) < 1e-4 * (1 + std::abs(want)));
    }
  }
}

}  // namespace autosp::test
