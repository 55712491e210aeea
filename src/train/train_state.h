// A run's parameters, gradients and optimizer state: one interface for every ZeRO mode
// (config/config.h ZeroMode), chosen once by make_train_state. The step loop (train/trainer.cpp)
// asks it for what the graph is fed, hands it the values the backward produces, and has it clip and
// update; it never asks which mode it runs. The modes:
//   replicated          whole parameters and AdamW state; on several ranks the gradients are
//                       all-reduced in buckets while the backward runs (train/grad_sync.h)
//   sharded_moments     ZeRO-1: the same buckets reduce-scattered; ZeroAdamW (train/optimizer.h)
//                       holds the moments of this rank's shard and all-gathers the updated
//                       parameters
//   sharded_gradients   ZeRO-2: ZeRO-1, and each bucket (and the graph's gradient outputs) freed
//                       once reduce-scattered
//   sharded_parameters  ZeRO-3: Zero3State holds this rank's shards of the parameters and moments;
//                       the graph gathers and reduce-scatters (graph/passes/shard_parameters.h)
// Each holds its parameters in groups: every parameter over the world, or with
// moe.expert_parallel_size E > 1 the dense parameters over the world and this rank's 1/E of the
// experts over the ranks holding the same experts ("ep_replica"), whose gradients are summed and
// whose state is sharded there (decisions 162, 185).
// planned_state_bytes gives autosp-graph --plan-memory the same rules as figures. A new ZeRO-like
// state is one more class in train_state.cpp, one ZeroMode value and its case in both switches.
// Knows nothing of data, logging or checkpoint files.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "comm/job_comms.h"
#include "compiler/program.h"
#include "config/config.h"
#include "engine/executor.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"

namespace autosp {

class TrainState {
 public:
  virtual ~TrainState() = default;

  // What the graph's parameter nodes are fed: whole parameters, or this rank's shards (ZeRO-3).
  virtual const ParamMap& graph_params() const = 0;
  // Graph outputs the executor may free after the hook has seen them (ExecOptions::transient_outputs).
  virtual std::set<std::string> transient_outputs() const { return {}; }

  // The executor's hook for each value: a gradient goes to its bucket, started buckets progress.
  virtual void offer(const Node& /*n*/, const Tensor& /*value*/) {}
  // After the run: this step's gradients, summed over the world (or this rank's summed shards).
  virtual void finish_backward(const RunResult& r) = 0;

  // The global L2 norm of this step's gradients (a collective over `host` where sharded).
  virtual double grad_norm(Communicator& host) = 0;
  // Clips the gradients to train.grad_clip given their norm, then one AdamW update with `lr`.
  virtual void update(const TrainConfig& t, double norm, double lr) = 0;

  // Whole tensors by parameter name on every rank (collectives where sharded): the parameters,
  // this step's gradients (--dump-grads), the AdamW state (checkpoints).
  virtual ParamMap whole_params() = 0;
  virtual ParamMap whole_grads() = 0;
  virtual AdamW checkpoint_state() = 0;

  // Bytes this rank holds: AdamW state, and gradient bucket buffers between steps.
  virtual size_t state_bytes() const = 0;
  virtual size_t grad_bucket_bytes() const { return 0; }
  // The gradient synchronisation's time, cumulative (none where the graph synchronises).
  virtual GradSyncStats sync_stats() const { return {}; }
};

// The state of `mode` for `prog` (the joint program), from whole parameters and AdamW state on the
// host (a checkpoint's of any world size or stage, or fresh), placed on `device` and sharded over
// `comms`' world as the mode says.
std::unique_ptr<TrainState> make_train_state(ZeroMode mode, const RankProgram& prog, ParamMap params, AdamW opt,
                                             const Config& cfg, JobComms& comms, Device device);

// What a rank holds outside the memory plan's arena for a step, by the same rules, from the bytes
// of the graph's parameter nodes and gradient outputs over `world` ranks (autosp-graph
// --plan-memory). Zero for a graph without gradients (forward only).
struct PlannedStateBytes {
  size_t optimizer = 0;     // the AdamW moments
  size_t grad_buckets = 0;  // gradient buckets (whole and/or reduce-scattered shards)
  size_t freed_outputs = 0; // graph outputs not held past their bucket (ZeRO-2's gradients)
};
PlannedStateBytes planned_state_bytes(ZeroMode mode, size_t param_bytes, size_t grad_bytes, int world);

}  // namespace autosp
