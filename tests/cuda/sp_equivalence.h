// The GPU SP equivalence check, shared by the MPI runner (sp_equivalence_test.cpp: one GPU per
// rank, NCCL between them) and the thread-rank one (test_thread_sp.cpp: P rank threads on one
// GPU): AutoSP training with P ranks on CUDA must give the losses, gradient norms and weights of
// single-process training on the CPU on the same batches.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "common/tiny_models.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "train/trainer.h"

namespace autosp::cudatest {

inline Config make(const std::string& arch, int64_t sp, const std::string& device, const std::string& dtype,
                   int64_t seq_len = 64) {
  nlohmann::json model = testing::tiny_model(arch, 64, 2, 96);
  if (arch == "gpt2") model["max_position_embeddings"] = 128;
  return parse_config({{"model", model},
                       {"data", {{"source", "synthetic"}, {"seq_len", seq_len}, {"batch_size", 2}}},
                       {"train", {{"lr", 1e-3}, {"min_lr", 1e-3}, {"warmup_steps", 1}, {"grad_clip", 1.0}}},
                       {"runtime", {{"device", device}, {"dtype", dtype}}},
                       {"sequence_parallel", {{"autosp_size", sp}}}});
}

// ‖a − b‖ / ‖b‖ over every parameter (host tensors).
inline double weights_rel_l2(const ParamMap& a, const ParamMap& b) {
  double num = 0, den = 0;
  for (const auto& [name, t] : b) {
    const auto x = a.at(name).to_doubles(), y = t.to_doubles();
    for (size_t i = 0; i < y.size(); ++i) {
      num += (x[i] - y[i]) * (x[i] - y[i]);
      den += y[i] * y[i];
    }
  }
  return std::sqrt(num / den);
}

// Trains `cfg` on every rank of a world of P ranks and returns rank 0's result.
using TrainOnRanks = std::function<TrainResult(const Config& cfg, const TrainArgs& args)>;

// Five AdamW steps of AutoSP with P ranks on CUDA against one CPU process: every step's loss and
// gradient norm within loss_tol (the norm 10x), the final weights within weight_tol (rel. L2).
inline void compare(const std::string& arch, const std::string& dtype, int64_t P, double loss_tol, double weight_tol,
                    const TrainOnRanks& train_on_ranks, bool print, int64_t seq_len = 64) {
  TrainArgs args;
  args.quiet = true;
  const TrainResult gpu = train_on_ranks(with_steps(make(arch, P, "cuda", dtype, seq_len), 5), args);
  auto one = make_single_process_communicator();
  const TrainResult cpu = train(with_steps(make(arch, 1, "cpu", dtype, seq_len), 5), args, *one);
  REQUIRE(gpu.steps.size() == cpu.steps.size());
  double worst = 0;
  for (size_t i = 0; i < cpu.steps.size(); ++i) {
    INFO(arch << " " << dtype << " P=" << P << " S=" << seq_len << " step " << i + 1 << ": loss cuda " << gpu.steps[i].loss << " cpu "
              << cpu.steps[i].loss << "; grad norm cuda " << gpu.steps[i].grad_norm << " cpu " << cpu.steps[i].grad_norm);
    const double e = std::abs(gpu.steps[i].loss - cpu.steps[i].loss) / std::abs(cpu.steps[i].loss);
    CHECK(e <= loss_tol);
    CHECK(std::abs(gpu.steps[i].grad_norm - cpu.steps[i].grad_norm) <= 10 * loss_tol * cpu.steps[i].grad_norm);
    worst = std::max(worst, e);
  }
  const double wd = weights_rel_l2(gpu.params, cpu.params);
  CHECK(wd <= weight_tol);
  if (print)
    std::printf("%s %s P=%lld S=%lld: worst loss rel. error %.2e, weights rel. L2 %.2e\n", arch.c_str(), dtype.c_str(),
                static_cast<long long>(P), static_cast<long long>(seq_len), worst, wd);
}

}  // namespace autosp::cudatest
